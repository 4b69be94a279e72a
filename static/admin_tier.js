// The Disk tier panel: status and directory, size, blocks, RAM vs disk hit rate, load latency, write queue, drops.
const $ = (id) => document.getElementById(id);

// why there are no counters, by the feed's tier status
const OFF_TEXT = {
  off: "No disk tier: kv_disk_bytes is 0, or prefix caching is off.",
  "not opened": "A disk tier was asked for but could not be opened; the server log says why.",
};

function setText(id, text) {
  const node = $(id);
  if (node.textContent !== text) node.textContent = text;
}

/** 1536 -> "1.5 KiB": binary units, one decimal below 100 (as app/admin/advice.py's format_bytes). */
export function formatBytes(numBytes) {
  let value = numBytes;
  for (const unit of ["B", "KiB", "MiB", "GiB"]) {
    if (value < 1024 || unit === "GiB") {
      if (unit === "B") return Math.trunc(value) + " B";
      return (value < 100 ? value.toFixed(1) : value.toFixed(0)) + " " + unit;
    }
    value /= 1024;
  }
  return "";
}

function pct(rate) {
  return rate == null ? "–" : (rate * 100).toFixed(rate === 0 || rate >= 0.995 ? 0 : 1) + "%";
}

function seconds(value) {
  if (value == null) return "–";
  return value < 1 ? (value * 1000).toFixed(value < 0.01 ? 1 : 0) + " ms" : value.toFixed(2) + " s";
}

/** Draw the feed's `tier` panel; `point` gives the last minute's RAM and disk hit rates. */
export function renderTier(tier, point) {
  const status = $("tier-status");
  status.dataset.status = tier.status;
  setText("tier-status", tier.status);
  setText("tier-dir", tier.directory || "");
  const off = OFF_TEXT[tier.status];
  $("tier-off").hidden = !off;
  $("tier-fields").hidden = Boolean(off);
  if (off) {
    setText("tier-off", off);
    return;
  }
  setText("tier-used", formatBytes(tier.used_bytes));
  setText("tier-cap", "of " + formatBytes(tier.capacity_bytes) + " cap");
  setText("tier-blocks", String(tier.num_blocks));
  setText("tier-files", tier.num_files + " files in the directory");
  setText("tier-ram-hits", pct(point.ram_hit_rate));
  setText("tier-disk-hits", pct(point.disk_hit_rate));
  setText("tier-load", seconds(tier.mean_load_seconds));
  const perLoad = tier.num_loads ? " · " + tier.blocks_per_load.toFixed(1) + " blocks each" : "";
  setText("tier-load-sub", tier.num_loads ? "mean of " + tier.num_loads + " loads" + perLoad : "no load yet");
  setText("tier-queue", String(tier.write_queue_depth));
  const lag = tier.write_queue_depth ? "oldest " + seconds(tier.write_lag_seconds) : "none queued";
  setText("tier-lag", lag + " · " + tier.num_writes + " written");
  setText("tier-drops", tier.num_write_drops + " / " + tier.num_write_errors);
  setText("tier-failures", tier.num_load_failures + " unreadable blocks · " + tier.num_evictions + " evicted");
  setText("tier-evicted", String(tier.num_lookups_evicted));
  setText("tier-lookups", "of " + tier.num_lookups + " lookups");
}
