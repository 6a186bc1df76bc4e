#!/usr/bin/env python3
"""BENCHMARKS.md's plots, drawn from figures.json beside this file.

    python3 benches/plots/plot.py                 # every SVG from figures.json (make bench-plots)
    python3 benches/plots/plot.py --check         # fails if an SVG is not what figures.json draws (make lint)
    python3 benches/plots/plot.py import-cost F   # the response-size sweep of make bench-cost-sizes
                                                  # (comparison/results-cost.json) into figures.json
    python3 benches/plots/plot.py import-week F.. # the days make bench-pg-partitions printed
                                                  # (its output) into figures.json

Standard library only, SVG written by hand: a fresh machine needs nothing
installed, and the SVGs are text that a diff can read. figures.json holds
only figures that BENCHMARKS.md quotes, each chart with its source (the
make target, the date and the commit of the run).
"""
import datetime
import json
import math
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIGURES = os.path.join(HERE, "figures.json")

# Colour-blind-safe (Okabe and Ito), each series also told apart by its
# marker or dash so that a grey print still reads.
COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"]
DASHES = ["", "6 3", "2 3", "8 3 2 3", "", "4 2"]
FONT = "font-family='Helvetica, Arial, sans-serif'"


def esc(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def text(x, y, body, size=12, anchor="start", weight="normal", colour="#222", extra=""):
    return (f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' "
            f"font-weight='{weight}' fill='{colour}' {FONT} {extra}>{esc(body)}</text>")


def line(x1, y1, x2, y2, colour="#222", width=1, dash=""):
    dashed = f" stroke-dasharray='{dash}'" if dash else ""
    return (f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' stroke='{colour}' "
            f"stroke-width='{width}'{dashed}/>")


def marker(kind, x, y, colour, size=4.5):
    if kind == "circle":
        return f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{size:.1f}' fill='{colour}'/>"
    if kind == "ring":
        return f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{size:.1f}' fill='white' stroke='{colour}' stroke-width='2'/>"
    if kind == "square":
        return (f"<rect x='{x - size:.1f}' y='{y - size:.1f}' width='{2 * size:.1f}' height='{2 * size:.1f}' "
                f"fill='{colour}'/>")
    if kind == "diamond":
        s = size * 1.3
        return (f"<polygon points='{x:.1f},{y - s:.1f} {x + s:.1f},{y:.1f} {x:.1f},{y + s:.1f} {x - s:.1f},{y:.1f}' "
                f"fill='{colour}'/>")
    if kind == "triangle":
        s = size * 1.2
        return (f"<polygon points='{x:.1f},{y - s:.1f} {x + s:.1f},{y + s * 0.8:.1f} {x - s:.1f},{y + s * 0.8:.1f}' "
                f"fill='{colour}'/>")
    raise ValueError(kind)


def lines_of(value):
    """A subtitle or footnote: one line, or a list of lines."""
    return value if isinstance(value, list) else [value]


def svg(width, height, body):
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}'>\n<rect width='100%' height='100%' fill='white'/>\n"
            + "\n".join(body) + "\n</svg>\n")


def log_ticks(low, high):
    """1, 2, 5 times powers of ten between low and high."""
    ticks = []
    for exponent in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        for step in (1, 2, 5):
            value = step * 10 ** exponent
            if low <= value * (1 + 1e-9) and value <= high * (1 + 1e-9):
                ticks.append(value)
    return ticks


def tick_label(value):
    return f"{value:g}" if value >= 0.01 else f"{value:.0e}"


def latency_chart(chart):
    """Median and tail per system, one row each, grouped, on a log axis:
    a filled marker at the median, a ring at the tail (p99), a bar between.
    A system keeps its colour in every group."""
    groups = chart["groups"]
    rows = sum(len(group["rows"]) for group in groups)
    label_width, plot_width, right = 330, 430, 140
    top, row_height, group_gap = 78, 22, 30
    subtitle, footnote = lines_of(chart["subtitle"]), lines_of(chart.get("footnote", []))
    top += 14 * (len(subtitle) - 1)
    height = top + rows * row_height + len(groups) * group_gap + 62 + 14 * len(footnote)
    width = label_width + plot_width + right
    low, high = chart["axis_ms"]
    digits = chart.get("digits", 2)
    scale = plot_width / (math.log10(high) - math.log10(low))
    colours = {}
    for group in groups:
        for row in group["rows"]:
            colours.setdefault(row["label"], COLOURS[len(colours) % len(COLOURS)])

    def x_of(ms):
        return label_width + (math.log10(ms) - math.log10(low)) * scale

    body = [text(16, 26, chart["title"], size=16, weight="bold")]
    body += [text(16, 46 + 14 * i, line_, size=11, colour="#555") for i, line_ in enumerate(subtitle)]
    # Legend, above the plot.
    legend_y = top - 12
    body.append(marker("circle", label_width + 8, legend_y - 4, "#222"))
    body.append(text(label_width + 18, legend_y, "median (p50)", size=11))
    body.append(line(label_width + 112, legend_y - 4, label_width + 142, legend_y - 4, "#222", 2))
    body.append(marker("ring", label_width + 142, legend_y - 4, "#222"))
    body.append(text(label_width + 152, legend_y, chart.get("tail_label", "p99"), size=11))
    ticks = log_ticks(low, high)
    grid = []
    y = top
    for group in groups:
        y += group_gap
        body.append(text(16, y - 8, group["title"], size=12, weight="bold"))
        # The grid behind this group's rows only, so that no line crosses a title.
        group_bottom = y + len(group["rows"]) * row_height
        for tick in ticks:
            major = math.isclose(math.log10(tick), round(math.log10(tick)))
            grid.append(line(x_of(tick), y, x_of(tick), group_bottom, "#ccc" if major else "#eee", 1))
        for row in group["rows"]:
            colour = colours[row["label"]]
            centre = y + row_height / 2
            body.append(text(label_width - 10, centre + 4, row["label"], size=11, anchor="end"))
            if row.get("median") is None:
                body.append(text(label_width + 6, centre + 4, row.get("note", "n/a"), size=11, colour="#555"))
            else:
                x_median, x_tail = x_of(row["median"]), x_of(row["p99"])
                body.append(line(x_median, centre, x_tail, centre, colour, 3))
                body.append(marker("ring", x_tail, centre, colour))
                body.append(marker("circle", x_median, centre, colour))
                # The figures themselves, right of the tail.
                body.append(text(x_tail + 9, centre + 4, f"{row['median']:.{digits}f} / {row['p99']:.{digits}f} ms",
                                 size=10, colour="#444"))
            y += row_height
    plot_bottom = y + 8
    for tick in ticks:
        x = x_of(tick)
        grid.append(line(x, plot_bottom, x, plot_bottom + 4, "#333", 1))
        grid.append(text(x, plot_bottom + 16, tick_label(tick), size=10, anchor="middle", colour="#333"))
    grid.append(line(label_width, plot_bottom, label_width + plot_width, plot_bottom, "#333", 1))
    grid.append(text(label_width + plot_width / 2, plot_bottom + 36, chart["x_label"], size=12, anchor="middle"))
    grid += [text(16, plot_bottom + 58 + 14 * i, line_, size=10, colour="#555") for i, line_ in enumerate(footnote)]
    return svg(width, height, grid + body)


MARKERS = ["circle", "square", "diamond", "triangle", "ring"]


def series_line(s, points):
    """Series s's line through points (x, y), a marker at each."""
    colour = COLOURS[s % len(COLOURS)]
    joined = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dash = f" stroke-dasharray='{DASHES[s]}'" if DASHES[s] else ""
    return ([f"<polyline points='{joined}' fill='none' stroke='{colour}' stroke-width='2'{dash}/>"]
            + [marker(MARKERS[s % len(MARKERS)], x, y, colour, 3.2) for x, y in points])


def legend_and_footnote(chart, left, legend_y, footnote):
    """A legend row a series (its dash and marker, its name), then the footnote."""
    body = []
    for s, name in enumerate(chart["series"]):
        colour = COLOURS[s % len(COLOURS)]
        y = legend_y + s * 20
        body.append(line(left, y - 4, left + 34, y - 4, colour, 2, DASHES[s]))
        body.append(marker(MARKERS[s % len(MARKERS)], left + 17, y - 4, colour, 3.2))
        body.append(text(left + 44, y, name, size=11))
    body += [text(16, legend_y + len(chart["series"]) * 20 + 6 + 14 * i, line_, size=10, colour="#555")
             for i, line_ in enumerate(footnote)]
    return body


PANEL_WIDTH, PANEL_LEFT, PANEL_GAP = 390, 80, 100


class Panels:
    """The layout of a chart of panels side by side under its title and
    subtitle, with a legend and a footnote below them."""

    def __init__(self, chart, panel_height):
        subtitle = lines_of(chart["subtitle"])
        self.footnote = lines_of(chart.get("footnote", []))
        self.top = 96 + 14 * (len(subtitle) - 1)
        self.panel_height = panel_height
        count = len(chart["panels"])
        self.width = PANEL_LEFT + count * PANEL_WIDTH + (count - 1) * PANEL_GAP + 30
        self.height = (self.top + panel_height + 66 + len(chart["series"]) * 20
                       + 14 * len(self.footnote) + 10)
        self.body = [text(16, 26, chart["title"], size=16, weight="bold")]
        self.body += [text(16, 46 + 14 * i, line_, size=11, colour="#555")
                      for i, line_ in enumerate(subtitle)]

    def x0(self, p):
        return PANEL_LEFT + p * (PANEL_WIDTH + PANEL_GAP)

    def axes(self, x0, x_label, y_label):
        """A panel's two axes and their labels."""
        top, y0 = self.top, self.top + self.panel_height
        return [line(x0, y0, x0 + PANEL_WIDTH, y0, "#333", 1), line(x0, top, x0, y0, "#333", 1),
                text(x0 + PANEL_WIDTH / 2, y0 + 38, x_label, size=12, anchor="middle"),
                text(x0 - 46, top + self.panel_height / 2, y_label, size=12, anchor="middle",
                     extra=f"transform='rotate(-90 {x0 - 46:.1f} {top + self.panel_height / 2:.1f})'")]

    def finish(self, chart):
        self.body += legend_and_footnote(chart, PANEL_LEFT, self.top + self.panel_height + 66, self.footnote)
        return svg(self.width, self.height, self.body)


def size_label(size):
    if size >= 1024 and size % 1024 == 0:
        return f"{size // 1024} KB"
    return f"{size} B"


def cost_chart(chart):
    """Dollars per million requests against the response's size, a panel per
    request kind, a line per implementation, a marker at each measured size;
    both axes logarithmic (sizes in powers of two, dollars in 1-2-5 steps),
    so that the small sizes and the cheap reads are as readable as the large."""
    panel_width, panel_height = PANEL_WIDTH, 320
    layout = Panels(chart, panel_height)
    top, body = layout.top, layout.body
    sizes = chart["sizes"]
    x_low, x_high = math.log2(min(sizes)), math.log2(max(sizes))
    y_low, y_high = chart["y_axis"]
    for p, panel in enumerate(chart["panels"]):
        x0 = layout.x0(p)
        y0 = top + panel_height

        def x_of(size):
            return x0 + (math.log2(size) - x_low) / (x_high - x_low) * panel_width

        def y_of(value):
            return y0 - (math.log10(value) - math.log10(y_low)) / (math.log10(y_high) - math.log10(y_low)) * panel_height

        body.append(text(x0 + panel_width / 2, top - 12, panel["title"], size=13, anchor="middle", weight="bold"))
        for tick in log_ticks(y_low, y_high):
            y = y_of(tick)
            major = math.isclose(math.log10(tick), round(math.log10(tick)))
            body.append(line(x0, y, x0 + panel_width, y, "#ccc" if major else "#eee", 1))
            body.append(text(x0 - 6, y + 4, f"{tick:g}", size=10, anchor="end", colour="#333"))
        for size in sizes:
            exponent = math.log2(size)
            if exponent != int(exponent) or int(exponent) % 2:
                continue  # label every other power of two: 256 B, 1 KB, 4 KB ...
            x = x_of(size)
            body.append(line(x, y0, x, y0 + 4, "#333", 1))
            body.append(text(x, y0 + 17, size_label(size), size=10, anchor="middle", colour="#333"))
        body += layout.axes(x0, chart["x_label"], chart["y_label"])
        for s, name in enumerate(chart["series"]):
            values = panel["series"].get(name)
            if values is not None:
                body += series_line(s, [(x_of(size), y_of(v)) for size, v in zip(sizes, values)])
    return layout.finish(chart)


def linear_ticks(high):
    """0 and 1, 2 or 5 times a power of ten up to high, four to eight of them."""
    step = 10 ** math.floor(math.log10(high))
    for factor in (0.1, 0.2, 0.5, 1):
        if high / (step * factor) <= 8:
            step *= factor
            break
    return [i * step for i in range(int(high / step + 1e-9) + 1)]


def daily_chart(chart):
    """A value a simulated day, a panel per measure, a line per layout; linear
    axes from zero, a marker at each measured day (a day not measured has
    none), so that growth and a plateau read as they are."""
    panel_width, panel_height = PANEL_WIDTH, 280
    layout = Panels(chart, panel_height)
    top, body = layout.top, layout.body
    days = chart["days"]
    for p, panel in enumerate(chart["panels"]):
        x0 = layout.x0(p)
        y0 = top + panel_height
        y_high = panel["y_max"]

        def x_of(day):
            return x0 + (day - days[0] + 0.5) / len(days) * panel_width

        def y_of(value):
            return y0 - value / y_high * panel_height

        body.append(text(x0 + panel_width / 2, top - 12, panel["title"], size=13, anchor="middle", weight="bold"))
        for tick in linear_ticks(y_high):
            y = y_of(tick)
            body.append(line(x0, y, x0 + panel_width, y, "#ddd", 1))
            body.append(text(x0 - 6, y + 4, f"{tick:g}", size=10, anchor="end", colour="#333"))
        for day in days:
            body.append(line(x_of(day), y0, x_of(day), y0 + 4, "#333", 1))
            body.append(text(x_of(day), y0 + 17, str(day), size=10, anchor="middle", colour="#333"))
        body += layout.axes(x0, chart["x_label"], panel["y_label"])
        for s, name in enumerate(chart["series"]):
            measured = [(x_of(day), y_of(v)) for day, v in zip(days, panel["series"].get(name, []))
                        if v is not None]
            if measured:
                body += series_line(s, measured)
    return layout.finish(chart)


def draw(check=False):
    """Writes each chart's SVG, or with check, says which differ from what
    figures.json draws (a figure changed without its plot, or by hand)."""
    with open(FIGURES) as f:
        figures = json.load(f)
    stale = []
    for name, chart in figures.items():
        if name.startswith("_"):
            continue
        drawn = {"latency": latency_chart, "cost": cost_chart, "daily": daily_chart}[chart["kind"]](chart)
        path = os.path.join(HERE, f"{name}.svg")
        if check:
            try:
                with open(path) as f:
                    current = f.read()
            except FileNotFoundError:
                current = None
            if current != drawn:
                stale.append(os.path.relpath(path))
            continue
        with open(path, "w") as f:
            f.write(drawn)
        print(f"wrote {os.path.relpath(path)}")
    if stale:
        sys.exit(f"not what figures.json draws (run make bench-plots): {', '.join(stale)}")


def save(figures):
    """figures.json as a person reads it: a row or a list of figures on one line."""
    text_ = json.dumps(figures, indent=1, ensure_ascii=False)
    # An object or a list that holds no other is written on one line.
    compact = re.sub(r"[\[{][^\[\]{}]*[\]}]", lambda m: " ".join(m.group(0).split()), text_)
    # Whitespace inside a string would be squeezed too: then keep the plain form.
    text_ = compact if json.loads(compact) == figures else text_
    with open(FIGURES, "w") as f:
        f.write(text_ + "\n")


def import_cost(path):
    """The sweep's dollars per million requests into figures.json's cost
    chart: every size the run priced, the new request and the replay."""
    with open(path) as f:
        results = json.load(f)
    with open(FIGURES) as f:
        figures = json.load(f)
    chart = figures["cost-by-response-size"]
    by = {}
    for key, result in results.items():
        name, scenario, size = key.rsplit("/", 2)
        by.setdefault((name, scenario), {})[int(size)] = result["dollars_per_million"]
    sizes = sorted({size for series in by.values() for size in series})
    chart["sizes"] = sizes
    for panel in chart["panels"]:
        panel["series"] = {}
        for series, implementation in chart["implementations"].items():
            measured = by.get((implementation, panel["scenario"]))
            if measured and all(size in measured for size in sizes):
                panel["series"][series] = [round(measured[size], 4) for size in sizes]
    # The run's date and commit, in the plot itself.
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                            text=True).stdout.strip() or "an unknown commit"
    chart["subtitle"][0] = (f"make bench-cost-sizes, {datetime.date.today().isoformat()} at {commit}: "
                            "units from the calls on the wire, priced at")
    save(figures)
    print(f"{len(sizes)} sizes from {path} into {os.path.relpath(FIGURES)}")


DAY_LINE = re.compile(r"^\s*(Plain|Partitioned) day (\d+): [\d.]+ s, dead tuples (\d+), live tuples (\d+), "
                      r"size ([\d.]+) MB; write p50 ([\d.]+) ms p99 ([\d.]+) ms")


def import_week(paths):
    """The days that make bench-pg-partitions printed (its output, one file
    a layout or both in one) into figures.json's week chart: table size and
    dead tuples at the end of each simulated day."""
    days = {}
    for path in paths:
        with open(path) as f:
            for found in map(DAY_LINE.match, f):
                if found:
                    layout, day = found.group(1).lower(), int(found.group(2))
                    days.setdefault(layout, {})[day] = {
                        "size_gb": round(float(found.group(5)) / 1024, 2),
                        "dead_millions": round(int(found.group(3)) / 1e6, 2),
                    }
    with open(FIGURES) as f:
        figures = json.load(f)
    chart = figures["postgres-week"]
    last = max(day for measured in days.values() for day in measured)
    chart["days"] = list(range(1, max(last, 7) + 1))
    for panel in chart["panels"]:
        panel["series"] = {}
        for series, layout in chart["layouts"].items():
            measured = days.get(layout, {})
            panel["series"][series] = [measured[day][panel["measure"]] if day in measured else None
                                       for day in chart["days"]]
    save(figures)
    print(f"days {sorted(days.get('plain', {}))} (plain) and {sorted(days.get('partitioned', {}))} "
          f"(partitioned) into {os.path.relpath(FIGURES)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["import-week"] and len(sys.argv) > 2:
        import_week(sys.argv[2:])
    elif sys.argv[1:2] == ["import-cost"]:
        import_cost(sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "..", "comparison",
                                                                          "results-cost.json"))
    elif sys.argv[1:] == ["--check"]:
        draw(check=True)
    elif len(sys.argv) == 1:
        draw()
    else:
        sys.exit(__doc__)
