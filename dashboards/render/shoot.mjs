// Opens the rendered dashboard in Debian's Chromium (headless, through
// playwright-core: no browser download), waits for every panel, writes
// the screenshot, and fails unless every panel drew data.
//
//   node shoot.mjs <page URL> <out.png>

import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url, out] = process.argv.slice(2);
if (!url || !out) {
  console.error("usage: node shoot.mjs <page URL> <out.png>");
  process.exit(2);
}

// A fresh profile, and none of Chromium's own traffic: this machine's
// network is closed, and its refused connections slow every start.
const profile = mkdtempSync(join(tmpdir(), "dashboard-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1600, height: 900 },
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let failed = false;
try {
  const page = await context.newPage();
  page.on("pageerror", (error) => { console.error("page error:", error.message); failed = true; });
  await page.goto(url);
  await page.waitForFunction(() => window.dashboardDone === true, null, { timeout: 60_000 });
  const report = await page.evaluate(() => window.dashboardReport);
  await page.screenshot({ path: out, fullPage: true });
  for (const panel of report) {
    const ok = !panel.error && panel.series > 0 && panel.points >= 5;
    if (!ok) failed = true;
    console.log(`${ok ? "ok  " : "FAIL"} ${panel.title} [${panel.type}, ${panel.unit}]: ` +
                `${panel.series} series, ${panel.points} points${panel.error ? ", " + panel.error : ""}`);
  }
  console.log(`screenshot: ${out}`);
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
