// Canvas helpers of the admin page: a canvas drawn in CSS pixels at the screen's pixel density (both admin canvases
// start each frame here), and colours read from the theme's CSS custom properties.

// Size the backing store to width x height CSS pixels at devicePixelRatio and return a cleared 2D context.
export function hidpiContext(canvas, width, height) {
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  return ctx;
}

// A colour from the theme's CSS custom properties (`--map-free`, ...: static/base.css), so dark mode recolours the
// canvases; `fallback` where the property is not set. Read at each frame.
export function themeColor(name, fallback) {
  const value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return value || fallback;
}

/** Run `redraw` whenever static/theme.js switches the theme. */
export function onThemeChange(redraw) {
  document.addEventListener("pagedchat:theme", () => redraw());
}
