"""A job's story as one self-contained HTML page: a timeline with a lane per rank, grouped by node, and the
report under it. Pure: a Story in, a string out.

Self-contained means nothing is fetched: the styles and the few lines of script are inline, the timeline is
plain positioned elements (percentages of the job's length, so it fits any window), and a
Content-Security-Policy forbids the page every load (`default-src 'none'`), so a page opened years later,
offline, on a laptop, is the page that was written. Lanes are folded by node past story_lanes.FOLD_OVER
ranks, with the odd ones out shown: the page stays small (a 1024-rank job of 3 attempts: about 1 MB) and
quick to draw, for a folded node's lanes are not even in the document until its `<details>` is opened: they
wait as HTML text in a JSON block, put in by a few lines of script (the browser parses and lays out the
lanes people look at, not the 1000 they do not).
"""

from __future__ import annotations

import datetime
import html
import json
import math
from collections import Counter
from collections.abc import Iterable

from detlaunch.observe.rank_sets import format_ranks
from detlaunch.observe.story_lanes import NodeLanes, lanes
from detlaunch.observe.story_model import Mark, Span, Story, Window

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
GLYPHS = {"cause": "\u2716", "failure": "\u2715", "stop": "\u25a0", "sigkill": "\u2620", "lost": "\u2298",
          "joined": "\u25b8", "replaced": "\u21c4", "launcher": "\u25b9", "sshd": "\u25b9", "hang": "\u231b"}
OTHER_GLYPH = "\u25c6"  # a kind this page has no glyph for (straggler, a plugin's)

STYLE = """
*{box-sizing:border-box}body{font:13px/1.35 system-ui,sans-serif;margin:0;color:#222;background:#fff}
header,main>section{padding:8px 16px}h1{font-size:18px;margin:4px 0}h2{font-size:15px;margin:12px 0 4px}
.verdict{font-size:15px;font-weight:600}.verdict.bad{color:#b00}.verdict.good{color:#276738}
.facts{color:#555}.warn{color:#8a5a00;background:#fff6e0;padding:4px 8px;border-left:3px solid #e0a000}
.legend span{margin-right:12px;white-space:nowrap}.legend b{display:inline-block;width:14px;height:10px;
vertical-align:middle;margin-right:4px}
#timeline{position:relative;margin:0 16px;border:1px solid #ddd}
.lane{display:flex;height:18px;border-top:1px solid #f0f0f0;position:relative}
.lane:hover{background:rgba(0,80,200,.06)}
.label{flex:0 0 230px;padding:0 6px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;font-size:12px;
line-height:18px;background:#fafafa;border-right:1px solid #ddd;position:relative;z-index:2}
.track{flex:1;position:relative;z-index:1}
.nodelane{background:#f4f6f9;font-weight:600;height:20px}.nodelane .label{background:#eef1f6}
.node{border-top:2px solid #c8cfdb}.node.lost>.nodelane .label{color:#b00}
.axis{height:22px;background:#fff;border-bottom:1px solid #ccc}.axis .label{font-weight:600}
.tick{position:absolute;top:0;height:100%;border-left:1px solid #ccc;font-size:11px;color:#666;padding-left:2px}
.bands{position:absolute;top:0;bottom:0;left:230px;right:0;z-index:0;pointer-events:none}
.band{position:absolute;top:0;bottom:0}.band.attempt:nth-child(odd){background:#f5f8ff}
.band.attempt:nth-child(even){background:#fbfaf0}
.band.backoff{background:repeating-linear-gradient(45deg,#eee,#eee 4px,#fff 4px,#fff 8px)}
.band.hang{background:rgba(255,170,0,.18);border-left:1px dashed #e09000;border-right:1px dashed #e09000}
.bandlabel{position:absolute;top:2px;font-size:11px;font-weight:600;color:#345;white-space:nowrap}
.s{position:absolute;top:3px;height:12px;min-width:2px;border-radius:2px;font-size:10px;line-height:12px;
color:#fff;overflow:hidden;white-space:nowrap;padding-left:2px;font-weight:normal}
.nodelane .s{top:4px;opacity:.75}
.s.ok{background:#3a9d5d}.s.failed{background:#d33}.s.stopped{background:#9aa3ad}.s.killed{background:#e08a00}
.s.running{background:repeating-linear-gradient(90deg,#5b8def,#5b8def 6px,#8fb0f5 6px,#8fb0f5 12px)}
.s.cause{background:#900;outline:2px solid #ff4d4d;z-index:3}
.m{position:absolute;top:0;font-style:normal;font-size:12px;line-height:18px;transform:translateX(-50%);z-index:4;
cursor:default}
.m.cause,.m.failure{color:#b00}.m.lost{color:#b00;font-size:14px}.m.stop{color:#555;font-size:9px}
.m.sigkill{color:#000}.m.joined,.m.launcher,.m.sshd{color:#38a}.m.replaced{color:#080;font-weight:bold}
.m.hang{color:#c70}.m.other{color:#8a2be2}
details.folded>summary{cursor:pointer;font-size:11px;color:#345;padding:0 6px 0 236px;position:relative;z-index:2;
white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
pre{background:#f7f7f7;border:1px solid #e4e4e4;padding:8px;overflow-x:auto;font-size:12px;max-height:60vh}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left;font-size:12px}
footer{color:#777;font-size:11px;padding:8px 16px}button{font-size:12px}
"""

SCRIPT = """
addEventListener('load',function(){void document.body.offsetHeight;
document.documentElement.dataset.drawnMs=Math.round(performance.now());});
var lanes=null;function fill(d){if(d.dataset.filled)return;d.dataset.filled='1';
if(!lanes)lanes=JSON.parse(document.getElementById('folded-lanes').textContent);
d.insertAdjacentHTML('beforeend',lanes[d.dataset.node]||'');}
document.querySelectorAll('details.folded').forEach(function(d){
d.addEventListener('toggle',function(){if(d.open)fill(d);});});
var b=document.getElementById('unfold');if(b){b.addEventListener('click',function(){
var ds=document.querySelectorAll('details.folded'),open=!(ds.length&&ds[0].open);
ds.forEach(function(d){if(open)fill(d);d.open=open;});b.textContent=open?'fold the nodes':'unfold every node';});
if(location.hash==='#unfold')b.click();}
"""


def render(story: Story, title: str | None = None) -> str:
    """The page of `story`."""
    e = html.escape
    span = max(story.end - story.start, 1e-3)
    groups = lanes(story)
    folded = any(g.folded for g in groups)
    head = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{e(title or f'job {story.job_id}: {story.verdict}')}</title><style>{STYLE}</style></head>")
    parts = [head, "<body>", _header(story, folded), '<main><section id="timeline-section">']
    parts.append(_legend())
    parts.append('<div id="timeline">')
    parts.append(_bands(story, span))
    parts.append(_axis(story, span))
    marks_by = _marks_by_lane(story)
    folded_lanes: dict[int, str] = {}
    for group in groups:
        parts.append(_node(story, group, marks_by, span, folded_lanes))
    parts.append("</div></section>")
    if folded_lanes:  # JSON in a data block; "</" escaped so that no lane can end the block early
        data = json.dumps(folded_lanes, separators=(",", ":")).replace("</", "<\\/")
        parts.append(f'<script type="application/json" id="folded-lanes">{data}</script>')
    parts.append(_attempts(story))
    report = "\n".join(story.report) or "(the logs hold no end of the job)"
    parts.append(f'<section id="report"><h2>Report</h2><pre>{e(report)}</pre></section>')
    parts.append(f"</main><footer>Written by detlaunch report from {e(', '.join(story.files) or 'no log')}. "
                 "Times are seconds from the job's first event.</footer>")
    parts.append(f"<script>{SCRIPT}</script></body></html>\n")
    return "".join(parts)


def _header(story: Story, folded: bool) -> str:
    e = html.escape
    good = story.exit_code == 0
    began = datetime.datetime.fromtimestamp(story.start, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") \
        if story.start else "?"
    nodes = story.planned_nodes or len(story.nodes)
    ranks = story.planned_ranks or len(story.spans)
    facts = [f"layer {story.layer or '?'}", f"{ranks} rank(s) on {nodes} node(s)",
             f"{len(story.attempts)} attempt(s)", f"started {began}", f"{story.end - story.start:.1f} s of events"]
    out = [f'<header><h1>job {e(story.job_id or "?")}</h1>',
           f'<p class="verdict {"good" if good else "bad"}" id="verdict">{e(story.verdict)}</p>',
           f'<p class="facts">{e(" · ".join(facts))}</p>']
    if story.problems:
        out.append(f'<p class="warn" id="problems">{e(story.problems)}</p>')
    missing = story.missing_logs()
    if missing and story.planned_nodes:
        out.append(f'<p class="warn" id="missing">no log of node(s) {e(format_ranks(missing))} was read: '
                   "their ranks are not shown (give their events-node-N.jsonl too)</p>")
    if folded:
        out.append(f'<p class="facts">Over {len(story.spans)} ranks, each node\'s ranks are folded into its lane; '
                   'the ranks that did not go through the job as their node\'s others did keep a lane of their own. '
                   '<button id="unfold" type="button">unfold every node</button> (or open the page as '
                   '<code>report.html#unfold</code>)</p>')
    out.append("</header>")
    return "".join(out)


def _legend() -> str:
    items = [("ok", "exit 0"), ("failed", "failed"), ("cause", "root cause"), ("stopped", "stopped by detlaunch"),
             ("killed", "killed"), ("running", "no end in the log")]
    spans = "".join(f'<span><b class="s {c}" style="position:static;display:inline-block"></b>{w}</span>'
                    for c, w in items)
    marks = "".join(f'<span><i class="m {k}" style="position:static;transform:none">{g}</i> {k}</span>'
                    for k, g in GLYPHS.items() if k not in ("sshd",))
    return f'<p class="legend">{spans}{marks}</p>'


def _pct(t: float, story: Story, span: float) -> str:
    return f"{100.0 * (t - story.start) / span:.2f}"


def _width(a: float, b: float, span: float) -> str:
    return f"{max(100.0 * (b - a) / span, 0.0):.2f}"


def _bands(story: Story, span: float) -> str:
    e = html.escape
    out = ['<div class="bands">']
    for w in [*story.attempts, *story.windows]:
        out.append(f'<div class="band {w.kind}" data-kind="{w.kind}" style="left:{_pct(w.start, story, span)}%;'
                   f'width:{_width(w.start, w.end, span)}%" title="{e(_window_title(w, story))}"></div>')
    out.append("</div>")
    return "".join(out)


def _window_title(w: Window, story: Story) -> str:
    return f"{w.text}: +{w.start - story.start:.1f} s to +{w.end - story.start:.1f} s ({w.end - w.start:.1f} s)"


def _axis(story: Story, span: float) -> str:
    step = nice_step(span)
    ticks = []
    for i in range(int(span / step) + 1):
        left = 100.0 * i * step / span
        if left <= 97:
            ticks.append(f'<span class="tick" style="left:{left:.2f}%">+{_seconds(i * step)}</span>')
    labels = "".join(f'<span class="bandlabel" style="left:{_pct(w.start, story, span)}%">{html.escape(w.text)}</span>'
                     for w in story.attempts)
    return (f'<div class="lane axis"><span class="label">seconds</span><div class="track">{"".join(ticks)}</div>'
            f'</div><div class="lane axis attempts"><span class="label">attempts</span><div class="track">{labels}'
            "</div></div>")


def nice_step(span: float, ticks: int = 8) -> float:
    """A tick step of 1, 2 or 5 times a power of ten, giving about `ticks` ticks over `span` seconds."""
    raw = max(span / ticks, 1e-3)
    power = 10.0 ** math.floor(math.log10(raw))
    return next(float(m * power) for m in (1, 2, 5, 10) if m * power >= raw)


def _seconds(t: float) -> str:
    return f"{t:g} s" if t < 120 else f"{t / 60:g} min"


def _marks_by_lane(story: Story) -> dict[tuple[int, int | None], list[Mark]]:
    """Marks by (node, rank) lane, each shown once (a failure is logged by every node that heard of it)."""
    out: dict[tuple[int, int | None], list[Mark]] = {}
    seen: set[tuple[str, int | None, str]] = set()
    for m in story.marks:
        key = (m.kind, m.rank, m.text)
        if m.kind in ("failure", "cause") and key in seen:
            continue
        seen.add(key)
        node = story.spans[m.rank][-1].node if m.rank is not None and m.rank in story.spans else m.node
        out.setdefault((node, m.rank if m.rank in story.spans else None), []).append(m)
    return out


def _mark(m: Mark, story: Story, span: float) -> str:
    kind = m.kind if m.kind in GLYPHS else "other"
    glyph = GLYPHS.get(m.kind, OTHER_GLYPH)
    return (f'<i class="m {kind}" data-kind="{html.escape(m.kind)}" style="left:{_pct(m.time, story, span)}%" '
            f'title="+{m.time - story.start:.2f} s: {html.escape(m.text)}">{glyph}</i>')


def _node(story: Story, group: NodeLanes, marks_by: dict[tuple[int, int | None], list[Mark]], span: float,
          folded_lanes: dict[int, str]) -> str:
    """A node's lanes; its folded ranks' lanes go into `folded_lanes` (node -> their HTML), shown on unfolding."""
    e = html.escape
    node = story.nodes.get(group.node)
    host = node.host if node else ""
    lost = " lost" if node and node.lost else ""
    count = len(group.shown) + len(group.folded)
    track = "".join(_mark(m, story, span) for m in marks_by.get((group.node, None), ()))
    if group.folded:
        track = _summary(story, group.folded, span) + track
    label = f"node {group.node}" + (f" · {host}" if host else "") + f" · {count} rank(s)"
    out = [f'<section class="node{lost}" data-node="{group.node}"><div class="lane nodelane">'
           f'<span class="label" title="{e(label)}">{e(label)}</span><div class="track">{track}</div></div>']
    out.extend(_rank(story, r, marks_by, span, group.why.get(r)) for r in group.shown)
    if group.folded:
        out.append(f'<details class="folded" data-node="{group.node}"><summary>{len(group.folded)} more rank(s) of '
                   f'node {group.node}: {e(_alike(story, group.folded))}</summary></details>')
        folded_lanes[group.node] = "".join(_rank(story, r, marks_by, span, None) for r in group.folded)
    out.append("</section>")
    return "".join(out)


def _alike(story: Story, ranks: Iterable[int]) -> str:
    words = Counter(" then ".join(s.words for s in story.spans[r]) for r in ranks)
    return "; ".join(f"{w} ({n})" for w, n in words.most_common(3)) + ("; ..." if len(words) > 3 else "")


def _summary(story: Story, ranks: tuple[int, ...], span: float) -> str:
    """A folded node's ranks, one bar per attempt: from the first start to the last end, the usual outcome's colour."""
    out = []
    for attempt in sorted({s.attempt for r in ranks for s in story.spans[r]}):
        spans = [s for r in ranks for s in story.spans[r] if s.attempt == attempt]
        starts = [t for s in spans if (t := s.start) is not None]
        if not starts:
            continue
        ends = [story.end_of(s) for s in spans]
        outcome = Counter(s.outcome for s in spans).most_common(1)[0][0]
        words = Counter(s.words for s in spans)
        title = f"attempt {attempt}, {len(spans)} folded rank(s): " + ", ".join(f"{w} ({n})" for w, n in words.items())
        out.append(f'<b class="s {outcome}" style="left:{_pct(min(starts), story, span)}%;'
                   f'width:{_width(min(starts), max(ends), span)}%" title="{html.escape(title)}"></b>')
    return "".join(out)


def _rank(story: Story, rank: int, marks_by: dict[tuple[int, int | None], list[Mark]], span: float,
          odd: str | None) -> str:
    e = html.escape
    spans = story.spans[rank]
    cause = any(s.cause for s in spans)
    host = next((s.state.host for s in reversed(spans) if s.state.host), "")
    attrs = f' data-rank="{rank}" data-node="{spans[-1].node}"' + (' data-cause="1"' if cause else "")
    if odd:
        attrs += f' data-odd="{e(odd)}"'
    bars = "".join(_span(s, story, span) for s in spans)
    marks = "".join(_mark(m, story, span) for m in marks_by.get((spans[-1].node, rank), ()))
    label = f"rank {rank}" + (f" · {host}" if host else "")
    return (f'<div class="lane rank{" cause" if cause else ""}"{attrs}><span class="label" title="{e(odd or label)}">'
            f'{e(label)}</span><div class="track">{bars}{marks}</div></div>')


def _span(s: Span, story: Story, span: float) -> str:
    start = s.start if s.start is not None else story.start
    end = story.end_of(s)
    report = (s.status.describe() if s.status else "no end in the log") + s.note
    title = f"rank {s.rank}, attempt {s.attempt}: {s.words}, +{start - story.start:.1f}-{end - story.start:.1f} s" + (
        f"; report: {report}" if report != s.words else "")
    cls = f"s {s.outcome}" + (" cause" if s.cause else "")
    bar = (f'<b class="{cls}" data-attempt="{s.attempt}" style="left:{_pct(start, story, span)}%;'
           f'width:{_width(start, end, span)}%" title="{html.escape(title)}">{html.escape(s.words)}</b>')
    if s.cause:
        bar += (f'<i class="m cause" style="left:{_pct(end, story, span)}%" title="{html.escape(title)}">'
                f"{GLYPHS['cause']}</i>")
    return bar


def _attempts(story: Story) -> str:
    if not story.attempts:
        return ""
    rows = "".join(f"<tr><td>{html.escape(w.text)}</td><td>+{w.start - story.start:.1f} s</td>"
                   f"<td>+{w.end - story.start:.1f} s</td><td>{w.end - w.start:.1f} s</td></tr>"
                   for w in story.attempts)
    return (f'<section id="attempts"><h2>Attempts</h2><table><tr><th>attempt</th><th>from</th><th>to</th>'
            f"<th>took</th></tr>{rows}</table></section>")
