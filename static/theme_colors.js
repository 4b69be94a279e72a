// Colours for canvases, read from the page's CSS custom properties (static/base.css), so that drawings follow the
// light or dark theme; onThemeChange() tells a canvas to draw itself again when the theme changes.

/** The value of a CSS custom property ("--map-used") on the root element, e.g. "#4f7cf7". */
export function cssColor(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

/** Colours by key: {used: "--map-used", ...} -> {used: "#4f7cf7", ...}, read once per call (one style lookup). */
export function cssColors(names) {
  const style = getComputedStyle(document.documentElement);
  const colors = {};
  for (const [key, name] of Object.entries(names)) colors[key] = style.getPropertyValue(name).trim();
  return colors;
}

/** Run `redraw` whenever static/theme.js switches the theme. */
export function onThemeChange(redraw) {
  document.addEventListener("pagedchat:theme", () => redraw());
}
