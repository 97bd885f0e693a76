"""The HTML report's cost on a large suite: size, time to interactive, scrolling, printing.

    python benchmarks/html_report.py [--tests 500] [--repeat 5] [--points 100000]
                                     [--chartjs chart.umd.js] [--keep report.html]
                                     [--page report.html] [--profile]

Run from the repository root (it builds the report from tests/report_cases.py, the cases the
browser tests open): ``--tests`` recorded runs, each of 3,000 steps and two minutes of NVML
samples, a third of them with a starved DataLoader (a warning, GT102, so those tests start
open). Measured in Chromium (the distribution's, through Playwright, as the browser tests):

- the report's size and the time to build it (rule evaluation not counted);
- interactive: from the call to open the page until its main thread is free after the page's
  script reported ready (the summary sortable and filterable, every test's link working) and
  the frame after that was drawn (a rAF, then a task: the first moment an input would be
  handled at once), read on the page's clock, the median of ``--repeat`` loads; with the
  moment Playwright saw the page ready (its polling and round trips included), the time
  the page's main thread was busy (DevTools' TaskDuration) and the CPU time Chromium's
  processes used (on a machine shared with other jobs the wall time includes theirs);
- with ``--profile``: where the main thread's CPU time went while the page opened (``--repeat``
  more loads, traced: parsing, style, layout, paint, script, by DevTools' trace events; the
  median of each);
- scrolling with everything open: "Expand all", then the page scrolled a screen at a time,
  every 50 ms, ``--screens`` screens, while the timelines draw; the longest task (Long Tasks
  API) and how many took over 200 ms;
- printing: the page as it opens (the tests with a warning open, the others closed), the
  timelines drawn that printing draws (those of the first 40 open tests), then the page
  printed to PDF (A4), timed end to end;
- with ``--points``: uPlot drawing three series of that many points, beside Chart.js when
  ``--chartjs`` names its ``chart.umd.js`` (``npm pack chart.js``).

``--page`` measures a page already written (another commit's, say) instead of building one.

Goals (docs/report-html.md): at most 5 MB, interactive within 1 s, no long task over 200 ms
while scrolling, printed within 10 s.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage"]
# The first moment after the page's script reported ready, and the frame after it was drawn,
# that the main thread is free: checked in each frame's rAF, marked in the task after it.
INTERACTIVE = """
(function watch() {
  requestAnimationFrame(function () {
    if (window.gputrain && window.gputrain.ready) {
      setTimeout(function () {
        window.__interactive = performance.now();
        performance.mark("interactive");
      }, 0);
    } else {
      watch();
    }
  });
})();
"""
LONG_TASKS = """
window.__longTasks = [];
new PerformanceObserver(list => {
  list.getEntries().forEach(e => window.__longTasks.push([e.startTime, e.duration]));
}).observe({type: 'longtask', buffered: true});
"""
DRAW = """
(async ({points, library}) => {
  const xs = Array.from({length: points}, (_, i) => i / 10);
  const ys = [0, 1, 2].map(k => xs.map(x => Math.sin(x / 50 + k) * 50 + 50 + (x * 7919 % 13)));
  const box = document.createElement('div');
  document.body.appendChild(box);
  const started = performance.now();
  if (library === 'uplot') {
    new uPlot({width: 1000, height: 300, series: [{}, ...ys.map(() => ({stroke: 'blue'}))]},
              [xs, ...ys], box);
  } else {
    const canvas = document.createElement('canvas');
    canvas.width = 1000; canvas.height = 300;
    box.appendChild(canvas);
    new Chart(canvas, {type: 'line', data: {datasets: ys.map(y => ({
        data: xs.map((x, i) => ({x, y: y[i]})), pointRadius: 0, borderWidth: 1}))},
      options: {animation: false, parsing: false, normalized: true, responsive: false,
                plugins: {decimation: {enabled: false}}, scales: {x: {type: 'linear'}}}});
  }
  await new Promise(requestAnimationFrame);
  const elapsed = performance.now() - started;
  box.remove();
  return elapsed;
})
"""
SCROLL = """
async screens => {
  const started = performance.now();
  const step = Math.round(window.innerHeight * 0.9);
  for (let y = 0, n = 0; y <= document.documentElement.scrollHeight && n < screens;
       y += step, n++) {
    window.scrollTo(0, y);
    await new Promise(resolve => setTimeout(resolve, 50));
  }
  while (window.gputrain.drawQueue > 0) {
    await new Promise(resolve => setTimeout(resolve, 50));
  }
  const tasks = window.__longTasks.filter(t => t[0] >= started).map(t => t[1]);
  return {seconds: (performance.now() - started) / 1000, tasks: tasks,
          lanes: document.querySelectorAll('.lane').length,
          height: document.documentElement.scrollHeight};
}
"""


def chromium_cpu() -> float:
    """CPU seconds used so far by this process's Chromium processes (browser, renderers, GPU
    process): on a machine shared with other jobs, the part of a wall time that is the page's
    own work."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            if "chrom" in child.name().lower() or "headless" in child.name().lower():
                times = child.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


# What the main thread did, by DevTools' trace event names (self time: a parse that runs a
# script counts the script under "script"); V8's own events (v8.*, V8.GC*) are script too.
PHASES = {"ParseHTML": "parse HTML", "DecodedDataDocumentParser::AppendBytes": "parse HTML",
          "DocumentLoader::BodyLoadingFinished": "read and decode the file",
          "DocumentLoader::BodyDataReceivedImpl": "read and decode the file",
          "EvaluateScript": "script", "FunctionCall": "script", "RunMicrotasks": "script",
          "MajorGC": "script", "MinorGC": "script",
          "UpdateLayoutTree": "style", "ParseAuthorStyleSheet": "style", "Layout": "layout",
          "PrePaint": "paint", "Paint": "paint", "Layerize": "paint", "Commit": "paint",
          "IntersectionObserverController::computeIntersections": "observers"}


def phase(name: str) -> str:
    return PHASES.get(name) or ("script" if name.lower().startswith("v8.") else "other")


def main_thread_profile(trace: dict[str, object]) -> dict[str, float]:
    """The CPU time (ms, self: an event less the events inside it) of the renderer's main
    thread by phase, from a Chromium trace, up to the moment the page was interactive (the
    user timing mark INTERACTIVE sets); "other" is the scheduler's own time and work the
    trace does not name. CPU time, not wall time: on a machine shared with other jobs, the
    time the thread waited for a core is not the page's."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert isinstance(events, list)
    parsing: collections.Counter[tuple[int, int]] = collections.Counter()
    for event in events:
        if event.get("name") == "ParseHTML":
            parsing[(event["pid"], event["tid"])] += event.get("dur", 0)
    main = parsing.most_common(1)[0][0]  # the page's renderer: the one that parsed it
    end = min((e["ts"] for e in events if e.get("name") == "interactive"
               and e.get("cat") == "blink.user_timing"), default=float("inf"))
    spans = sorted(((e["ts"], e["ts"] + e.get("dur", 0), e["name"], e.get("tdur", 0))
                    for e in events if (e.get("pid"), e.get("tid")) == main
                    and e.get("ph") == "X" and e["ts"] < end),
                   key=lambda span: (span[0], -span[1]))
    phases: collections.Counter[str] = collections.Counter()
    stack: list[tuple[int, int, str]] = []
    for start, stop, name, cpu in spans:  # self time: a span less the spans inside it
        while stack and stack[-1][1] <= start:
            stack.pop()
        phases[phase(name)] += cpu
        if stack:
            phases[phase(stack[-1][2])] -= cpu
        stack.append((start, stop, name))
    return {name: value / 1000 for name, value in phases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--points", type=int, default=0,
                        help="also time uPlot drawing 3 series of this many points")
    parser.add_argument("--chartjs", type=Path, help="Chart.js's chart.umd.js, to compare")
    parser.add_argument("--keep", type=Path, help="write the report here too")
    parser.add_argument("--screens", type=int, default=150,
                        help="screens scrolled with every test open (150: about 120 tests)")
    parser.add_argument("--page", type=Path,
                        help="measure this written page instead of building one")
    parser.add_argument("--profile", action="store_true",
                        help="also trace one load: where the main thread's time went")
    args = parser.parse_args()

    import report_cases
    from playwright.sync_api import sync_playwright

    from pytest_gputrain.plugin import load_features

    load_features()  # the scopes of the features' records (run, failure, distributed)
    from pytest_gputrain.report.html import assets, report_html

    folder = Path(tempfile.mkdtemp(prefix="gputrain-html-"))
    path = folder / "report.html"
    if args.page:
        shutil.copyfile(args.page, path)
        print(f"{args.page}: {path.stat().st_size / 1e6:.2f} MB (goal <= 5)")
    else:
        case = report_cases.many_tests(args.tests)
        report = case.report()
        flagged = len({f.subject for f in report.findings})
        started = time.perf_counter()
        page_text = report_html(report, case.facts)
        built = time.perf_counter() - started
        path.write_text(page_text, encoding="utf-8")
        print(f"{args.tests}-test report ({flagged} with findings): "
              f"{path.stat().st_size / 1e6:.2f} MB (goal <= 5), built and rendered in "
              f"{built:.2f} s")
    if args.keep:
        shutil.copyfile(path, args.keep)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        opened, seen, used, busy = [], [], [], []
        for _ in range(args.repeat):
            context = browser.new_context(viewport={"width": 1440, "height": 900})
            page = context.new_page()
            page.add_init_script(INTERACTIVE)
            session = context.new_cdp_session(page)
            session.send("Performance.enable")
            before = chromium_cpu()
            started = time.time()  # the page's clock is since the epoch too (timeOrigin)
            page.goto(path.as_uri())
            page.wait_for_function("window.gputrain && window.gputrain.ready")
            seen.append(time.time() - started)
            page.wait_for_function("() => window.__interactive")
            opened.append(page.evaluate("performance.timeOrigin + window.__interactive") / 1000
                          - started)
            used.append(chromium_cpu() - before)
            metrics = session.send("Performance.getMetrics")["metrics"]
            busy.append(next(m["value"] for m in metrics if m["name"] == "TaskDuration"))
            context.close()
        print(f"interactive in {statistics.median(opened):.2f} s (goal <= 1; median of "
              f"{args.repeat}, {min(opened):.2f}-{max(opened):.2f} s; seen ready by Playwright "
              f"at {statistics.median(seen):.2f} s); the page's main thread busy "
              f"{statistics.median(busy):.2f} s, Chromium's processes "
              f"{statistics.median(used):.2f} s of CPU")
        if args.profile:
            profiles = []
            for _ in range(args.repeat):
                page = browser.new_page(viewport={"width": 1440, "height": 900})
                page.add_init_script(INTERACTIVE)
                trace = folder / "trace.json"
                browser.start_tracing(page=page, path=str(trace), categories=[
                    "devtools.timeline", "blink.user_timing", "loading", "v8", "v8.execute"])
                page.goto(path.as_uri())
                page.wait_for_function("() => window.__interactive")
                browser.stop_tracing()
                page.close()
                profiles.append(main_thread_profile(json.loads(trace.read_text("utf-8"))))
            phases = {name: statistics.median(p.get(name, 0.0) for p in profiles)
                      for name in {name for p in profiles for name in p}}
            total = statistics.median(sum(p.values()) for p in profiles)
            print(f"the main thread's CPU until interactive {total:.0f} ms (traced, median of "
                  f"{args.repeat}): " + ", ".join(f"{name} {ms:.0f}" for name, ms in sorted(
                      phases.items(), key=lambda item: -item[1])))

        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.add_init_script(LONG_TASKS)
        page.goto(path.as_uri())
        page.wait_for_function("window.gputrain && window.gputrain.ready")
        page.click("#expand-all")
        before = chromium_cpu()
        scrolled = page.evaluate(SCROLL, args.screens)
        cpu = chromium_cpu() - before
        tasks = scrolled["tasks"]
        print(f"scrolled {args.screens} screens of {scrolled['height'] / 1e3:.0f}k px with "
              f"every test open in {scrolled['seconds']:.1f} s ({cpu:.1f} s of Chromium's CPU), "
              f"{scrolled['lanes']} lanes drawn: longest task {max(tasks, default=0):.0f} ms "
              f"(goal <= 200), {len(tasks)} over 50 ms, {sum(t > 200 for t in tasks)} over "
              "200 ms")
        page.close()

        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(path.as_uri())
        page.wait_for_function("window.gputrain && window.gputrain.ready")
        page.emulate_media(media="print")
        before = chromium_cpu()
        started = time.perf_counter()
        page.evaluate("window.gputrain.beforePrint()")
        pdf = page.pdf(format="A4")
        printed = time.perf_counter() - started
        print(f"printed to PDF (A4, as it opens) in {printed:.1f} s (goal <= 10; "
              f"{chromium_cpu() - before:.1f} s of Chromium's CPU): {len(pdf) / 1e6:.1f} MB")
        page.close()

        libraries = {"uplot": assets()["uplot_js"]} if args.points else {}
        if args.points and args.chartjs:
            libraries["chartjs"] = args.chartjs.read_text(encoding="utf-8")
        for name, script in libraries.items():
            page = browser.new_page()
            page.set_content("<html><body></body></html>")
            page.add_script_tag(content=script)
            times = [page.evaluate(DRAW, {"points": args.points, "library": name})
                     for _ in range(args.repeat)]
            print(f"{name}: 3 series of {args.points} points drawn in "
                  f"{statistics.median(times):.0f} ms (median of {args.repeat}; "
                  f"{min(times):.0f}-{max(times):.0f} ms), {len(script) / 1e3:.0f} KB of script")
            page.close()
        browser.close()


if __name__ == "__main__":
    main()
