// The waterfall's compressed axis (run.js): a gap of at least
// BREAK_MIN_MS in which no step works (only waits, backoffs, parked time)
// is drawn as a break BREAK_PX wide, labelled with its real length, when
// at the scale of the rest it would be wider than two breaks; the longest
// gaps first, while the rest keeps half the track. Short steps beside an
// hour-long wait stay readable; between breaks the axis is linear.
"use strict";

// pal.axisBreakPx is how wide a break is drawn.
pal.axisBreakPx = 56;

// pal.compressedScale is the axis over span ms for a track px wide, given
// the intervals ([start, end] in ms) in which some step worked: x(ms)
// gives the % of the track, pieces the linear stretches and the breaks
// between them, breaks the breaks. null when no gap is worth a break.
pal.compressedScale = function (intervals, span, px) {
  const BREAK_PX = pal.axisBreakPx, BREAK_MIN_MS = 1000;
  const busy = [];
  for (const [a, b] of intervals.map(([a, b]) => [Math.max(0, a), Math.min(span, b)]).filter(([a, b]) => b >= a).sort((p, q) => p[0] - q[0])) {
    const last = busy[busy.length - 1];
    if (last && a <= last[1]) last[1] = Math.max(last[1], b); else busy.push([a, b]);
  }
  if (busy.length === 0) return null;
  const gaps = [];
  let prev = 0;
  for (const [a, b] of busy) {
    if (a - prev >= BREAK_MIN_MS) gaps.push([prev, a]);
    prev = Math.max(prev, b);
  }
  if (span - prev >= BREAK_MIN_MS) gaps.push([prev, span]);
  gaps.sort((p, q) => (q[1] - q[0]) - (p[1] - p[0]));
  const chosen = [];
  let cut = 0;
  for (const g of gaps) {
    const len = g[1] - g[0], room = px - (chosen.length + 1) * BREAK_PX, rest = span - cut - len;
    if (room < px / 2 || rest <= 0 || len * room / rest <= 2 * BREAK_PX) break;
    chosen.push(g);
    cut += len;
  }
  if (chosen.length === 0) return null;
  chosen.sort((p, q) => p[0] - q[0]);
  const perMs = (px - chosen.length * BREAK_PX) / (span - cut);
  const pieces = [], breaks = [];
  let t = 0, x = 0;
  const P = v => v / px * 100;
  for (const [a, b] of chosen) {
    if (a > t) { pieces.push({ t0: t, t1: a, x0: P(x), x1: P(x + (a - t) * perMs) }); x += (a - t) * perMs; }
    const br = { t0: a, t1: b, x0: P(x), x1: P(x + BREAK_PX), brk: true };
    pieces.push(br);
    breaks.push(br);
    x += BREAK_PX;
    t = b;
  }
  if (span > t) pieces.push({ t0: t, t1: span, x0: P(x), x1: 100 });
  return {
    pieces, breaks,
    x(ms) {
      if (!(ms > 0)) return 0;
      for (const p of pieces) {
        if (ms <= p.t1) return p.t1 > p.t0 ? p.x0 + (ms - p.t0) / (p.t1 - p.t0) * (p.x1 - p.x0) : p.x0;
      }
      return 100;
    },
  };
}
