// Draws the panels of a Grafana dashboard JSON from Prometheus's HTTP API.
//
// What it reads of the JSON: the title; each panel's type ("timeseries" or
// "stat"), title, gridPos, fieldConfig.defaults (unit, min, max, decimals,
// custom.stacking.mode), and targets (expr, legendFormat); the query
// variables, each given its "All" value. What it stands in for: Grafana's
// $__rate_interval is the `rate` parameter (default 15s), a stat panel
// shows its series' last value. Everything else (thresholds, overrides,
// tooltips, transformations) is ignored.
//
// URL parameters: prometheus (base URL), start and end (Unix seconds),
// step (seconds, default 2), rate (default 15s), dashboard (default
// ../grafana/idempotency.json).
//
// When done it sets window.dashboardReport (one entry a panel: its title,
// unit, series and points with a value) and window.dashboardDone.

"use strict";

const PALETTE = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9",
                 "#705da0", "#37872d", "#fade2a"];

const params = new URLSearchParams(location.search);
const prometheus = params.get("prometheus") || "http://127.0.0.1:9090";
const end = Number(params.get("end") || Math.floor(Date.now() / 1000));
const start = Number(params.get("start") || end - 3600);
const step = Number(params.get("step") || 2);
const rateWindow = params.get("rate") || "15s";
const dashboardUrl = params.get("dashboard") || "../grafana/idempotency.json";

/** A value in a Grafana unit, as Grafana would print it (the units used here). */
function format(unit, value, decimals) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const fixed = (v, d) => v.toFixed(decimals ?? d);
  switch (unit) {
    case "percentunit": return fixed(value * 100, 1) + "%";
    case "percent": return fixed(value, 1) + "%";
    case "s":
      if (value === 0) return "0 s";
      if (value < 1e-3) return fixed(value * 1e6, 0) + " µs";
      if (value < 1) return fixed(value * 1e3, value < 0.01 ? 2 : 0) + " ms";
      return fixed(value, 2) + " s";
    case "ms": return fixed(value, 1) + " ms";
    case "reqps": return fixed(value, value < 10 ? 2 : 0) + " req/s";
    case "ops": return fixed(value, value < 10 ? 2 : 0) + " ops/s";
    case "bytes": {
      const units = ["B", "KiB", "MiB", "GiB", "TiB"];
      let at = 0;
      while (Math.abs(value) >= 1024 && at < units.length - 1) { value /= 1024; at += 1; }
      return fixed(value, at === 0 ? 0 : 1) + " " + units[at];
    }
    case "short": {
      const abs = Math.abs(value);
      if (abs >= 1e9) return fixed(value / 1e9, 1) + " Bil";
      if (abs >= 1e6) return fixed(value / 1e6, 1) + " Mil";
      if (abs >= 1e3) return fixed(value / 1e3, 1) + " K";
      return fixed(value, 0);
    }
    default: return fixed(value, 2);
  }
}

/** Enough decimals to tell an axis's ticks apart, `increment` apart. */
function tickDecimals(unit, increment) {
  if (unit === "s" || !(increment > 0)) return undefined;
  const scaled = unit === "percentunit" ? increment * 100 : increment;
  let decimals = 0;
  while (decimals < 6 && Math.abs(Math.round(scaled * 10 ** decimals) - scaled * 10 ** decimals) > 1e-6) decimals++;
  return decimals;
}

/** The expression with the dashboard's variables given values. */
function substitute(expr, variables) {
  let text = expr.replaceAll("$__rate_interval", rateWindow).replaceAll("${__rate_interval}", rateWindow);
  for (const [name, value] of Object.entries(variables)) {
    text = text.replaceAll("${" + name + "}", value).replaceAll("$" + name, value);
  }
  return text;
}

async function queryRange(expr) {
  const url = new URL("/api/v1/query_range", prometheus);
  url.search = new URLSearchParams({ query: expr, start, end, step }).toString();
  const answer = await (await fetch(url)).json();
  if (answer.status !== "success") throw new Error(`${answer.errorType}: ${answer.error}`);
  return answer.data.result;
}

function legend(format, labels) {
  if (!format) return JSON.stringify(labels);
  return format.replace(/\{\{\s*(\w+)\s*\}\}/g, (_, name) => labels[name] ?? "");
}

/** Every target's series, on one x axis. */
async function panelSeries(panel, variables, xs) {
  const series = [];
  for (const target of panel.targets || []) {
    const result = await queryRange(substitute(target.expr, variables));
    for (const { metric, values } of result) {
      const ys = new Array(xs.length).fill(null);
      for (const [t, v] of values) {
        const at = Math.round((t - start) / step);
        const value = Number(v);
        if (at >= 0 && at < xs.length && Number.isFinite(value)) ys[at] = value;
      }
      series.push({ label: legend(target.legendFormat, metric), ys });
    }
  }
  return series;
}

function box(panel) {
  const element = document.createElement("section");
  element.className = "panel";
  const { x, y, w, h } = panel.gridPos;
  element.style.gridColumn = `${x + 1} / span ${w}`;
  element.style.gridRow = `${y + 1} / span ${h}`;
  const title = document.createElement("h2");
  title.textContent = panel.title;
  const body = document.createElement("div");
  body.className = "body";
  element.append(title, body);
  document.getElementById("grid").append(element);
  return body;
}

function drawStat(body, panel, series, defaults) {
  const last = series.flatMap((s) => s.ys.filter((v) => v !== null).slice(-1));
  const value = document.createElement("div");
  value.className = "stat";
  value.textContent = last.length ? format(defaults.unit, last[0], defaults.decimals) : "No data";
  const sub = document.createElement("div");
  sub.className = "sub";
  sub.textContent = "last value";
  body.append(value, sub);
}

function drawTimeseries(body, panel, series, defaults, xs) {
  const stacked = defaults.custom?.stacking?.mode === "normal";
  let shown = series;
  if (stacked) {
    // Cumulative sums, drawn from the top one down, each filled to zero:
    // stacked areas.
    const sums = new Array(xs.length).fill(0);
    shown = series.map((s) => ({
      label: s.label,
      ys: s.ys.map((v, i) => (v === null ? null : (sums[i] += v))),
    })).reverse();
  }
  const colours = series.map((_, i) => PALETTE[i % PALETTE.length]);
  if (stacked) colours.reverse();
  const width = body.clientWidth;
  const height = Math.max(80, body.clientHeight - 30);
  const options = {
    width, height,
    legend: { show: true, live: false },
    cursor: { show: false },
    scales: { x: { time: true }, y: { range: (u, min, max) => [defaults.min ?? Math.min(0, min), defaults.max ?? (max > 0 ? max * 1.1 : 1)] } },
    axes: [
      // Room for the time labels in a narrow panel.
      { stroke: "#8e8e9f", grid: { stroke: "#2b2d33" }, ticks: { stroke: "#2b2d33" }, space: 80 },
      { stroke: "#8e8e9f", grid: { stroke: "#2b2d33" }, ticks: { stroke: "#2b2d33" }, size: 90,
        values: (u, ticks, axis, space, increment) => ticks.map((v) => format(defaults.unit, v, tickDecimals(defaults.unit, increment))) },
    ],
    series: [{}, ...shown.map((s, i) => ({
      label: s.label, stroke: colours[i], width: 1.5, points: { show: false },
      fill: stacked ? colours[i] + "cc" : undefined, spanGaps: false,
      value: (u, v) => format(defaults.unit, v),
    }))],
  };
  new uPlot(options, [xs, ...shown.map((s) => s.ys)], body);
}

async function main() {
  const dashboard = await (await fetch(dashboardUrl)).json();
  document.getElementById("title").textContent = dashboard.title;
  document.getElementById("note").textContent =
    `${new Date(start * 1000).toISOString().slice(11, 19)} to ${new Date(end * 1000).toISOString().slice(11, 19)} UTC` +
    ` · $__rate_interval = ${rateWindow} · Prometheus ${prometheus} · rendered by dashboards/render (not Grafana)`;
  const variables = {};
  for (const variable of dashboard.templating?.list || []) {
    if (variable.type === "query") variables[variable.name] = variable.allValue || ".*";
  }
  const xs = [];
  for (let t = start; t <= end; t += step) xs.push(t);
  const report = [];
  for (const panel of dashboard.panels) {
    const body = box(panel);
    const defaults = panel.fieldConfig?.defaults || {};
    const entry = { title: panel.title, type: panel.type, unit: defaults.unit, series: 0, points: 0 };
    report.push(entry);
    try {
      const series = await panelSeries(panel, variables, xs);
      entry.series = series.length;
      entry.points = series.reduce((n, s) => n + s.ys.filter((v) => v !== null).length, 0);
      if (!entry.points) {
        body.innerHTML = '<div class="nodata">No data</div>';
      } else if (panel.type === "stat") {
        drawStat(body, panel, series, defaults);
      } else {
        drawTimeseries(body, panel, series, defaults, xs);
      }
    } catch (error) {
      entry.error = String(error);
      body.innerHTML = `<div class="error"></div>`;
      body.firstChild.textContent = entry.error;
    }
  }
  window.dashboardReport = report;
  window.dashboardDone = true;
}

main().catch((error) => {
  document.getElementById("grid").textContent = String(error);
  window.dashboardReport = [{ error: String(error) }];
  window.dashboardDone = true;
});
