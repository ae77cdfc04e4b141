"""Tests of the bench plotter (bench/plot_benches.py) on synthetic reports of the shapes `ragstream eval`,
`ragstream bench load` and `ragstream bench volume` print: the SVGs are well-formed XML with one
polyline per series and a point per measurement, placed the right way up, named in the legend, the same
bytes for the same input; a missing report skips its plot, a malformed one fails with a message. Run by
test.sh: python3 -m unittest deploy/scripts/bench/test_plot_benches.py (standard library only)."""

import copy
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "plot_benches.py"
_spec = importlib.util.spec_from_file_location("plot_benches", SCRIPT)
pb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pb)
SVG = "{http://www.w3.org/2000/svg}"


def summary(p50, scale=1.0):
    return {"n": 100, "p50_ms": p50, "p90_ms": p50 * 1.5 * scale, "p99_ms": p50 * 2 * scale, "max_ms": p50 * 3 * scale}


def by_budget(recalls):
    return {str(b): {"contexts": 10, "mean_tokens_used": b / 2, "answer_recall": r} for b, r in recalls.items()}


EVAL_SQUAD = {
    "dataset": "squad", "queries": 10,
    "ragstream": {"ndcg_at_10": 0.9, "by_budget": by_budget({1000: 0.95, 500: 0.90, 2000: 0.97}),
                  "by_budget_fill": by_budget({500: 0.91, 1000: 0.96, 2000: 0.98})},
    "naive_dense_topk": {"ndcg_at_10": 0.7, "by_budget": by_budget({500: 0.80, 1000: 0.85, 2000: 0.88})},
}
# As SciFact's real report: per-budget packing measures but no answer_recall.
EVAL_SCIFACT = {"dataset": "scifact", "queries": 5,
                "ragstream": {"by_budget": {"3000": {"contexts": 5, "mean_tokens_used": 700.0}}},
                "naive_dense_topk": {"by_budget": {"3000": {"contexts": 5}}}}
LOAD = {
    "embedder": "minilm", "index": "embedded", "documents": {"seed": 200, "streamed": 1800},
    "idle": {"with_query_embedding": summary(20.0), "embedding_cached": summary(4.0),
             "job_latency_total": summary(15.0)},
    "loaded": {"with_query_embedding": summary(60.0), "embedding_cached": summary(9.0),
               "job_latency_total": summary(50.0)},
    "ingest": {"chunks": 5000, "seconds": 50.0, "chunks_per_s": 100.0},
}
VOLUME = {
    "workers": 1, "cores": 4,
    "grow": {"chunks": 100000, "seconds": 50.0, "chunks_per_s": 2000.0,
             "bands": [{"chunks": c, "chunks_per_s": r, "at_s": c / 2000, "memory": {"rss_mib": 100.0}}
                       for c, r in ((25000, 2500.0), (50000, 2100.0), (75000, 1900.0), (100000, 1700.0))],
             "queries_by_band": [{"chunks_from": f, "chunks_to": f + 25000,
                                  "queries": {"round_trip": summary(p), "job_without_embedding": summary(p / 2)}}
                                 for f, p in ((0, 5.0), (25000, 6.0), (50000, 7.0), (75000, 8.0))]},
}


class PlotBenches(unittest.TestCase):
    def setUp(self):
        self.dir = Path(tempfile.mkdtemp(prefix="plot-benches-"))
        self.addCleanup(shutil.rmtree, self.dir)

    def write(self, name, report):
        (self.dir / name).write_text(json.dumps(report) if not isinstance(report, str) else report)

    def run_script(self):
        return subprocess.run([sys.executable, str(SCRIPT), str(self.dir)], capture_output=True, text=True)

    def all_reports(self):
        self.write("eval-squad.json", EVAL_SQUAD)
        self.write("eval-scifact.json", EVAL_SCIFACT)
        self.write("load.json", LOAD)
        self.write("volume.json", VOLUME)

    def polylines(self, name):
        root = ET.parse(self.dir / name).getroot()
        self.assertEqual(root.tag, SVG + "svg")
        lines = {p.get("data-label"): [tuple(map(float, xy.split(","))) for xy in p.get("points").split()]
                 for p in root.iter(SVG + "polyline")}
        legend = [t.text for g in root.iter(SVG + "g") if g.get("class") == "legend" for t in g.iter(SVG + "text")]
        captions = [t.text for t in root.iter(SVG + "text") if t.get("class") == "caption"]
        return lines, legend, captions

    def test_every_plot_has_a_polyline_per_series_the_right_way_up_and_a_legend(self):
        self.all_reports()
        result = self.run_script()
        self.assertEqual(result.returncode, 0, result.stderr)

        lines, legend, captions = self.polylines("answer-recall-by-budget.svg")
        self.assertEqual(sorted(lines), sorted(legend))
        self.assertEqual(set(lines), {"ragstream, default", "ragstream, fill", "naive dense top-k"})
        self.assertTrue(all(len(points) == 3 for points in lines.values()), lines)
        default = lines["ragstream, default"]
        self.assertEqual(default, sorted(default), "budgets run left to right in numeric order")
        self.assertGreater(default[0][1], default[2][1], "recall 0.90 is drawn below 0.97 (larger SVG y)")
        self.assertGreater(lines["naive dense top-k"][0][1], default[0][1], "0.80 below 0.90")
        self.assertTrue(any("eval-squad.json" in c for c in captions), captions)
        self.assertTrue(any("SciFact" in c and "not plotted" in c for c in captions), captions)

        lines, legend, captions = self.polylines("latency-idle-vs-ingest.svg")
        self.assertEqual(len(lines), 4)
        self.assertEqual(sorted(lines), sorted(legend))
        self.assertTrue(all(len(points) == 4 for points in lines.values()), "p50, p90, p99, max")
        idle, loaded = lines["idle, query embedded"], lines["ingest, query embedded"]
        self.assertGreater(idle[0][1], loaded[0][1], "20 ms idle is drawn below 60 ms loaded")
        self.assertTrue(all(a[0] < b[0] for a, b in zip(idle, idle[1:])))
        self.assertTrue(any("100 chunks/s" in c for c in captions), captions)

        lines, legend, captions = self.polylines("volume-ingest-rate.svg")
        self.assertEqual(set(lines), {"ingest rate", "round trip p50", "round trip p99"})
        self.assertEqual(set(legend), set(lines))
        self.assertEqual([len(lines[k]) for k in sorted(lines)], [4, 4, 4])
        rate = lines["ingest rate"]
        self.assertLess(rate[0][1], rate[-1][1], "2500 chunks/s is drawn above 1700")
        self.assertTrue(all(a[1] < b[1] for a, b in zip(lines["round trip p99"], lines["round trip p50"])),
                        "each p99 is drawn above its p50")
        self.assertTrue(any("volume.json" in c for c in captions), captions)

    def test_the_same_input_gives_the_same_bytes(self):
        self.all_reports()
        names = [name for name, _, _ in pb.PLOTS]
        self.assertEqual(self.run_script().returncode, 0)
        first = {n: (self.dir / n).read_bytes() for n in names}
        self.assertEqual(self.run_script().returncode, 0)
        self.assertEqual(first, {n: (self.dir / n).read_bytes() for n in names})

    def test_a_missing_report_skips_its_plot_only(self):
        self.write("load.json", LOAD)
        result = self.run_script()
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue((self.dir / "latency-idle-vs-ingest.svg").exists())
        self.assertFalse((self.dir / "answer-recall-by-budget.svg").exists())
        self.assertFalse((self.dir / "volume-ingest-rate.svg").exists())
        self.assertIn("skipping answer-recall-by-budget.svg: no eval-squad.json", result.stderr)
        self.assertIn("skipping volume-ingest-rate.svg: no volume.json", result.stderr)

    def test_a_malformed_report_fails_with_a_message_not_a_traceback(self):
        broken = copy.deepcopy(LOAD)
        del broken["loaded"]["embedding_cached"]
        cases = [("load.json", broken, "`loaded.embedding_cached`"),
                 ("load.json", "{not json", "not a JSON report"),
                 ("volume.json", dict(VOLUME, grow=dict(VOLUME["grow"], bands="many")), "`grow.bands` is not"),
                 ("eval-squad.json", {"dataset": "squad"}, "missing `ragstream.by_budget`")]
        for name, report, message in cases:
            with self.subTest(name=name, message=message):
                for p in self.dir.iterdir():
                    p.unlink()
                self.write(name, report)
                result = self.run_script()
                self.assertEqual(result.returncode, 1, result.stderr)
                self.assertIn(message, result.stderr)
                self.assertIn(name, result.stderr)
                self.assertNotIn("Traceback", result.stderr)

    def test_nice_ticks_cover_the_range_on_round_steps(self):
        self.assertEqual(pb.nice_ticks(0, 47)[0], [0, 10, 20, 30, 40, 50])
        ticks, decimals = pb.nice_ticks(0.855, 1.0)
        self.assertEqual([f"{t:.{decimals}f}" for t in ticks], ["0.85", "0.90", "0.95", "1.00"])
        self.assertEqual(pb.number(250000, 0), "250k")


if __name__ == "__main__":
    unittest.main()
