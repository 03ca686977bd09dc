"""Writes the peer suite's report: ``report.md`` and one PNG chart per
workload (matplotlib), from the ``results`` dict ``suite.py`` collected.

Ratios are "how many times better berth is": peer / berth for latencies and
times, berth / peer for throughput. A ratio above 1 means berth is ahead.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SYSTEMS = ("berth", "temporal", "restate")
COLORS = {"berth": "#1f77b4", "temporal": "#7f7f7f", "restate": "#ff7f0e"}


def ms(us) -> str:
    if us is None:
        return "–"
    return f"{us / 1000:.3f}" if abs(us) < 10_000 else f"{us / 1000:.0f}"


def ratio(peer, berth) -> str:
    if peer is None or berth is None or berth <= 0 or peer <= 0:
        return "–"
    r = peer / berth
    return f"{r:.1f}×" if r < 100 else f"{r:.0f}×"


def mib(b) -> str:
    return "–" if b is None else f"{b / 1048576:.1f}"


def get(d, *path):
    for p in path:
        if d is None:
            return None
        d = d[p] if isinstance(d, dict) and p in d else (
            d[p] if isinstance(d, list) and isinstance(p, int) and p < len(d) else None)
    return d


def wall_cell(r: dict, unit: str = "") -> str:
    """A timers run's wall; for the median of several runs, with their range."""
    walls = r.get("wall_runs_s") or []
    if len(walls) < 2:
        return f"{r['wall_s']:.3f}{unit}"
    return (f"{r['wall_s']:.3f}{unit} (median of {len(walls)} runs: "
            f"{min(walls):.3f}–{max(walls):.3f}{unit})")


def timers_at(system: dict | None, n: int):
    """A system's timers result for N = n (a size whose every run failed is
    missing from the list, so position is not size)."""
    for r in get(system, "timers") or []:
        if r.get("n") == n:
            return r
    return None


def systems_with(results, workload):
    return [s for s in SYSTEMS if workload in results["systems"].get(s, {})]


def write(results: dict, out: Path) -> None:
    lines: list[str] = []
    add = lines.append
    m = results["machine"]
    quick = results["mode"] == "quick"
    kind = "QUICK smoke run" if quick else "full run"
    if results.get("partial"):
        kind += (f" (partial: {', '.join(results['systems_run'])}; "
                 f"{', '.join(results['workloads_run'])})")
    add(f"# berth vs Temporal vs Restate — {kind}")
    add("")
    if quick:
        add("**This is a `--quick` run: few units, for checking that the suite works. "
            "Its figures are not the comparison; the full run's are.**")
        add("")
    add(f"Started {results['started']}, took {results['duration_s']} s. "
        f"Load average (1/5/15 min) before: {results['load_before']}, after: "
        f"{results['load_after']} on {m['cores']} cores — the figures are only as quiet "
        "as the machine was (per-system readings below; they include the load of the "
        "systems under test themselves).")
    add("")
    try:
        before = float(results["load_before"].split()[0])
    except (ValueError, IndexError):
        before = 0.0
    if before >= 1.5:
        add(f"**The machine was busy when this started** (1-minute load average {before:.1f} "
            f"on {m['cores']} cores from other work): latencies are overstated and "
            "throughputs understated, for every system; compare ratios with care.")
        add("")
    add("## Machine")
    add("")
    add("| | |")
    add("|---|---|")
    for k in ("host", "cpu", "cores", "ram_gib", "kernel", "filesystem", "disk", "work_dir"):
        add(f"| {k} | {m.get(k, '')} |")
    for k, v in m["versions"].items():
        add(f"| {k} | {v} |")
    add("")
    add("Every system ran on 127.0.0.1 inside one network namespace with only loopback, "
        "with its durable storage in the same work folder (the disk above): berth's redb "
        "journal, Temporal's dev server SQLite file (`--db-filename`), Restate's RocksDB "
        "base dir. Defaults everywhere else.")
    add("")
    for s in SYSTEMS:
        r = results["systems"].get(s)
        if not r:
            continue
        loads = ", ".join(f"{w}: {l}" for w, l in r.get("load", []))
        add(f"- load while {s} ran — {loads}")
        if r.get("error"):
            add(f"  - **{s} failed to start**: `{r['error'][:300]}`")
        for w, e in (r.get("errors") or {}).items():
            add(f"  - **{s} {w} failed**: `{e[:300]}`")
    add("")

    floor = results.get("floor")
    if floor:
        add("## Machine floor: 4 KiB + fsync on the same disk")
        add("")
        add("| what | samples | p50 µs | p99 µs | max µs |")
        add("|---|---|---|---|---|")
        add(f"| write + fsync, appended (issue 9's floor; the × fsync columns use its p50) | "
            f"{floor['count']} | {floor['p50_us']} | {floor['p99_us']} | {floor['max_us']} |")
        ow = results.get("floor_overwrite")
        if ow:
            add(f"| pwrite + fdatasync into preallocated pages (what berth's commit-log appends pay) | "
                f"{ow['count']} | {ow['p50_us']} | {ow['p99_us']} | {ow['max_us']} |")
        add("")
        add("An append changes the file's size, so its fsync also commits the filesystem "
            "journal; an overwrite of allocated pages with fdatasync does not. berth's "
            "journal makes a group durable by writing it into its commit log's preallocated "
            "blocks with `fdatasync`, so a berth round trip can come in under the append floor.")
        add("")

    # A section whose results are not what it expects (a driver that left a
    # figure out) says so in place; the rest of the report is still written,
    # so a long run is never left without one.
    for title, section in (
        ("timers", lambda: timers_section(results, out, add)),
        ("control", lambda: control_section(results, out, add, floor)),
        ("steps", lambda: steps_section(results, out, add)),
        ("density", lambda: density_section(results, out, add)),
        ("targets", lambda: targets_section(results, add, floor)),
    ):
        try:
            section()
        except Exception as e:  # noqa: BLE001 — reported in the report itself
            plt.close("all")
            add("")
            add(f"**The {title} section could not be rendered from results.json: "
                f"`{type(e).__name__}: {e}`.** The raw figures are in results.json.")
            add("")
    add("## How each figure is taken")
    add("")
    add("See the docstring of `conformance/bench/suite.py` (and, for berth, of "
        "`bench-core` sections 4–5 and `bench-sched` sections 1 and 3). All percentiles "
        "are nearest-rank over every sample. Raw figures: `results.json`.")
    add("")
    (out / "report.md").write_text("\n".join(lines))


def timers_section(results, out, add):
    syss = systems_with(results, "timers")
    if not syss:
        return
    add("## 1. Durable timer wake-ups (N units × 1 s)")
    add("")
    add("Unit lateness = the unit's own clock after waking − its clock at the park − 1 s. "
        "Client lateness = awake seen by the client (berth: `resumed` notification; peers: "
        "the unit's result) − (park request sent + 1 s). Wall = first request sent → last "
        "unit done (berth: last woken turn's `turn_ended`; peers: last result). Where a "
        "size ran several times (every system alike), each row is the run with the median "
        "wall, all its figures its own, and the wall cell gives the range of the runs.")
    add("")
    add("| system | N | unit p50 ms | unit p99 ms | unit max ms | client p50 ms | client p99 ms "
        "| wall s | wall ratio |")
    add("|---|---|---|---|---|---|---|---|---|")
    sizes = results["sizes"]["timers"]
    for n in sizes:
        berth_wall = get(timers_at(get(results, "systems", "berth"), n), "wall_s")
        for s in syss:
            r = timers_at(get(results, "systems", s), n)
            if not r:
                continue
            u, c = r["lateness_unit"], r["lateness_client"]
            add(f"| {s} | {n} | {ms(u['p50_us'])} | {ms(u['p99_us'])} | {ms(u['max_us'])} | "
                f"{ms(c['p50_us'])} | {ms(c['p99_us'])} | {wall_cell(r)} | "
                f"{'' if s == 'berth' else ratio(r['wall_s'], berth_wall)} |")
    add("")
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
    for i, n in enumerate(sizes):
        ax = axes[0][i]
        xs, p50, p99, mx, colors = [], [], [], [], []
        for s in syss:
            r = timers_at(get(results, "systems", s), n)
            if not r:
                continue
            u = r["lateness_unit"]
            xs.append(s)
            p50.append(max(u["p50_us"], 1) / 1000)
            p99.append(max(u["p99_us"], 1) / 1000)
            mx.append(max(u["max_us"], 1) / 1000)
            colors.append(COLORS[s])
        pos = range(len(xs))
        ax.bar([p - 0.27 for p in pos], p50, 0.27, label="p50", color=colors, alpha=0.5)
        ax.bar(list(pos), p99, 0.27, label="p99", color=colors, alpha=0.8)
        ax.bar([p + 0.27 for p in pos], mx, 0.27, label="max", color=colors, alpha=1.0)
        ax.set_xticks(list(pos), xs)
        ax.set_yscale("log")
        ax.set_ylabel("unit lateness after due (ms, log)")
        ax.set_title(f"{n} units × 1 s timer (bars: p50, p99, max)")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "timers.png", dpi=110)
    plt.close(fig)
    add("![timers](timers.png)")
    add("")


def control_section(results, out, add, floor):
    syss = systems_with(results, "control")
    if not syss:
        return
    n = results["sizes"]["control"]
    add(f"## 2. Control round trip ({n} sequential, {n} concurrent)")
    add("")
    add("berth *running* = `session/resume` with input written → `resumed` notification read "
        "(claim + turn start durable); berth *result* = → the resumed turn's `turn_ended` "
        "(its output journaled). Temporal: signal → workflow result. Restate: resolve "
        "durable promise → workflow result. Ratios: peer p50 / berth p50.")
    add("")
    add("| system | mode | figure | p50 ms | p99 ms | max ms | × fsync p50 | "
        "ratio vs berth running | ratio vs berth result |")
    add("|---|---|---|---|---|---|---|---|---|")
    fp50 = floor["p50_us"] if floor else None
    for mode in ("seq", "conc"):
        b_run = get(results, "systems", "berth", "control", mode, "running", "p50_us")
        b_res = get(results, "systems", "berth", "control", mode, "result", "p50_us")
        for s in syss:
            r = get(results, "systems", s, "control", mode)
            if not r:
                continue
            figures = ["running", "result"] if s == "berth" else ["result"]
            for f in figures:
                l = r[f]
                mult = f"{l['p50_us'] / fp50:.1f}" if fp50 else "–"
                ra = "" if s == "berth" else ratio(l["p50_us"], b_run)
                rb = "" if s == "berth" else ratio(l["p50_us"], b_res)
                add(f"| {s} | {mode} | {f} | {ms(l['p50_us'])} | {ms(l['p99_us'])} | "
                    f"{ms(l['max_us'])} | {mult} | {ra} | {rb} |")
    add("")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, mode in zip(axes, ("seq", "conc")):
        labels, p50, p99, colors = [], [], [], []
        for s in syss:
            r = get(results, "systems", s, "control", mode)
            if not r:
                continue
            for f in (["running", "result"] if s == "berth" else ["result"]):
                labels.append(f"{s}\n{f}")
                p50.append(r[f]["p50_us"] / 1000)
                p99.append(r[f]["p99_us"] / 1000)
                colors.append(COLORS[s])
        pos = range(len(labels))
        ax.bar([p - 0.2 for p in pos], p50, 0.4, color=colors, alpha=0.55, label="p50")
        ax.bar([p + 0.2 for p in pos], p99, 0.4, color=colors, alpha=1.0, label="p99")
        if fp50:
            ax.axhline(fp50 / 1000, color="red", linestyle="--", linewidth=1,
                       label="fsync p50")
        ax.set_xticks(list(pos), labels, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
        ax.set_title(f"resume/signal → unit ({'sequential' if mode == 'seq' else 'concurrent'}, "
                     f"{n})")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "control.png", dpi=110)
    plt.close(fig)
    add("![control](control.png)")
    add("")


def steps_section(results, out, add):
    syss = systems_with(results, "steps")
    if not syss:
        return
    add("## 3. Durable step throughput (units of 10 steps, closed loop)")
    add("")
    add("| system | concurrent units | units | steps/s | unit p50 ms | unit p99 ms | "
        "berth ratio |")
    add("|---|---|---|---|---|---|---|")
    berth_rows = {r["concurrency"]: r for r in get(results, "systems", "berth", "steps") or []}
    for s in syss:
        for r in results["systems"][s]["steps"]:
            b = berth_rows.get(r["concurrency"])
            ra = "" if s == "berth" or not b else ratio(b["steps_per_sec"], r["steps_per_sec"])
            add(f"| {s} | {r['concurrency']} | {r['units']} | {r['steps_per_sec']:.0f} | "
                f"{ms(r['unit_p50_us'])} | {ms(r['unit_p99_us'])} | {ra} |")
    add("")
    fig, ax = plt.subplots(figsize=(6, 4))
    for s in syss:
        rows = results["systems"][s]["steps"]
        ax.plot([r["concurrency"] for r in rows], [r["steps_per_sec"] for r in rows],
                marker="o", label=s, color=COLORS[s])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("concurrent units")
    ax.set_ylabel("durable steps/s (log)")
    ax.set_title("10 durable steps per unit")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "steps.png", dpi=110)
    plt.close(fig)
    add("![steps](steps.png)")
    add("")


def density_section(results, out, add):
    syss = systems_with(results, "density")
    if not syss:
        return
    add("## 4. Parked density and restart")
    add("")
    add("RSS and disk are the growth from an empty fresh instance to all units parked, "
        "per unit. Restart: the instance is stopped, the probes come due while it is "
        "down, then it is started again.")
    add("")
    add("| system | parked (+probes) | park time s | RSS total MiB | RSS B/unit | disk B/unit | "
        "stop s | restart → ready ms | restart → probes fired ms | RSS after restart MiB |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    for s in syss:
        d = results["systems"][s]["density"]
        add(f"| {s} | {d['parked']} (+{d['probes']}) | {d['park_s']:.1f} | "
            f"{mib(d['rss_parked_bytes'])} | {d['rss_per_unit_bytes']:.0f} | "
            f"{d['disk_per_unit_bytes']:.0f} | {d.get('stop_s', 0):.1f} | "
            f"{d['restart_ready_ms']:.0f} | "
            f"{d['restart_probes_ms']:.0f} | {mib(d['rss_restarted_bytes'])} |")
    add("")
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    ds = [(s, results["systems"][s]["density"]) for s in syss]
    for ax, key, title in (
        (axes[0], "rss_per_unit_bytes", "RSS per parked unit (bytes)"),
        (axes[1], "disk_per_unit_bytes", "disk per parked unit (bytes)"),
        (axes[2], "restart_probes_ms", "restart → overdue wake-ups fired (ms)"),
    ):
        ax.bar([s for s, _ in ds], [max(d[key], 1) for _, d in ds],
               color=[COLORS[s] for s, _ in ds])
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        for i, (_, d) in enumerate(ds):
            ax.annotate(f"N={d['parked']}", (i, max(d[key], 1)), ha="center",
                        va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "density.png", dpi=110)
    plt.close(fig)
    add("![density](density.png)")
    add("")


def targets_section(results, add, floor):
    """Issue 9's targets beside berth's figures. A target is only judged on
    the workload it names (1,000 and 10,000 timers, 100,000 parked units):
    a quick run's smaller sizes are listed as not measured, not as met."""
    b = results["systems"].get("berth")
    if not b:
        return
    add("## berth against the targets of issue 9")
    add("")
    add("| target | measured | met |")
    add("|---|---|---|")
    sizes = results["sizes"]

    def row(name, value, ok):
        met = "n/a" if ok is None else "yes" if ok else "**no**"
        add(f"| {name} | {value} | {met} |")

    def not_measured(name, what):
        row(name, f"not measured: {what}", None)

    t = timers_at(b, 1000)
    if t:
        row("1,000 × 1 s done in ≤ 1.1 s wall", wall_cell(t, " s"), t["wall_s"] <= 1.1)
    else:
        not_measured("1,000 × 1 s done in ≤ 1.1 s wall", f"this run parked {', '.join(f'{x:,}' for x in sizes['timers'])} units")
    t = timers_at(b, 10000)
    if t:
        v = t["lateness_unit"]["p99_us"] / 1000
        row("timer lateness p99 ≤ 10 ms at 10,000", f"{v:.3f} ms (unit); client p99 "
            f"{t['lateness_client']['p99_us'] / 1000:.3f} ms", v <= 10)
    else:
        not_measured("timer lateness p99 ≤ 10 ms at 10,000", f"this run parked {', '.join(f'{x:,}' for x in sizes['timers'])} units")
    n = sizes["control"]
    for mode in ("seq", "conc"):
        c = get(b, "control", mode, "running")
        if not c:
            continue
        if mode == "seq":
            row(f"control round trip p50 ≤ 1 ms ({mode})", f"{c['p50_us'] / 1000:.3f} ms",
                c["p50_us"] <= 1000)
        else:
            # All resumes written at once: the p50 unit waits behind half of
            # them, on any system, so only the ratio form applies.
            row(f"control round trip p50 ({mode}, {n:,} in flight)",
                f"{c['p50_us'] / 1000:.3f} ms: the 1 ms target is one round trip; with "
                f"{n:,} sent at once the median waits behind half of them, so the "
                "ratios below are the target here", None)
        # The ratios set berth's resume → running against the
        # peers' signal → result (its Restate fact: resolve → result 8.7 ms
        # ≈ 8 × 1 ms); berth's own → result ratio is given beside it.
        res = get(b, "control", mode, "result")
        for peer, need in (("restate", 8), ("temporal", 40)):
            p = get(results, "systems", peer, "control", mode, "result", "p50_us")
            if p:
                r = p / max(c["p50_us"], 1)
                also = (f"; result vs berth's result {p / max(res['p50_us'], 1):.1f}×"
                        if res else "")
                row(f"≥ {need}× {peer} ({mode}): its signal → result p50 / berth's "
                    "resume → running p50", f"{r:.1f}×{also}", r >= need)
    steps = {r["concurrency"]: r for r in (get(b, "steps") or [])}
    for peer in ("temporal", "restate"):
        for r in get(results, "systems", peer, "steps") or []:
            mine = steps.get(r["concurrency"])
            if mine:
                row(f"steps/s ahead of {peer} at {r['concurrency']}",
                    f"{mine['steps_per_sec']:.0f} vs {r['steps_per_sec']:.0f}",
                    mine["steps_per_sec"] > r["steps_per_sec"])
    d = get(b, "density")
    if d and d["parked"] >= 100_000:
        total = d["rss_parked_bytes"] / 1048576
        row(f"{d['parked']:,} parked under 500 MiB RSS", f"{total:.1f} MiB "
            f"(after restart {d['rss_restarted_bytes'] / 1048576:.1f} MiB)", total < 500)
    elif d:
        not_measured("100,000 parked under 500 MiB RSS",
                     f"this run parked {d['parked']:,} (RSS "
                     f"{d['rss_parked_bytes'] / 1048576:.1f} MiB; too few to scale up: "
                     "below the live-actor limit every session stays in memory)")
    add("")
