// A canvas drawn in CSS pixels at the screen's pixel density: both admin canvases start each frame here.

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
