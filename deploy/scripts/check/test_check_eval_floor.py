"""Tests of check_eval_floor.py: a report at its floors passes; each way of falling short is named."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import check_eval_floor  # noqa: E402


def report(ndcg, recall, naive, overruns=0):
    tally = {"overruns": overruns}
    return {
        "queries": 40,
        "ragstream": {
            "ndcg_at_10": ndcg,
            "recall_at_10": recall,
            "by_budget": {"8000": tally},
            "by_budget_fill": {"8000": {"overruns": 0}},
        },
        "naive_dense_topk": {"ndcg_at_10": naive},
    }


class CheckEvalFloor(unittest.TestCase):
    def floors(self):
        ndcg = check_eval_floor.FLOORS[("ragstream", "ndcg_at_10")]
        recall = check_eval_floor.FLOORS[("ragstream", "recall_at_10")]
        return ndcg, recall

    def test_a_report_at_its_floors_passes(self):
        ndcg, recall = self.floors()
        naive = ndcg - check_eval_floor.OVER_NAIVE
        self.assertEqual(check_eval_floor.check(report(ndcg, recall, naive)), [])

    def test_each_shortfall_is_named(self):
        ndcg, recall = self.floors()
        failures = check_eval_floor.check(report(ndcg - 0.01, recall - 0.01, ndcg, overruns=2))
        self.assertEqual(len(failures), 4, failures)
        self.assertTrue(any("ndcg_at_10" in f for f in failures))
        self.assertTrue(any("recall_at_10" in f for f in failures))
        self.assertTrue(any("naive" in f for f in failures))
        self.assertTrue(any("overran" in f for f in failures))


if __name__ == "__main__":
    unittest.main()
