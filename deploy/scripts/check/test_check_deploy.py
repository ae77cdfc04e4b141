"""Tests of the deployment checker's rules (check_deploy.py): each rule must refuse what it exists
to refuse, and accept what the repository's own files contain. Run by check/deploy.sh with the pinned
packages: python -m unittest deploy/scripts/check/test_check_deploy.py"""

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import check_deploy as cd  # noqa: E402


class ConfigModel(unittest.TestCase):
    def test_the_model_is_read_from_every_layer(self):
        # Structs of topologies (Config), enums of topologies (EmbedderKind) and of the core
        # (Encoding, in operators/core): a missing layer would make values unchecked.
        self.assertIn("embedder", cd.STRUCTS["Config"])
        self.assertIn("minilm", cd.ENUMS["EmbedderKind"])
        self.assertIn("o200k_base", cd.ENUMS["Encoding"])

    def test_a_minimal_config_passes(self):
        self.assertEqual(cd.check_config({"source": {"kind": "kafka"}}), [])

    def test_unknown_keys_bad_enum_values_and_secrets_are_refused(self):
        problems = cd.check_config({"source": {"kind": "kafka", "colour": "red"}})
        self.assertTrue(any("unknown key `source.colour`" in p for p in problems), problems)
        problems = cd.check_config({"source": {"kind": "kafka"}, "embedder": {"precision": "int4"}})
        self.assertTrue(any("embedder.precision" in p and "int8" in p for p in problems), problems)
        problems = cd.check_config({"source": {"kind": "kafka"}, "embedder": {"threads": -1}})
        self.assertTrue(any("non-negative integer" in p for p in problems), problems)
        self.assertTrue(any("missing [source]" in p for p in cd.check_config({})))

    def test_environment_overrides_name_real_keys_with_parsable_values(self):
        self.assertEqual(cd.check_override("RAGSTREAM_EMBEDDER__THREADS", "2"), [])
        self.assertEqual(cd.check_override("RAGSTREAM_EMBEDDER__QUERY_EXECUTOR", "false"), [])
        self.assertTrue(cd.check_override("RAGSTREAM_EMBEDDER__QUERY_EXECUTOR", "maybe"))
        self.assertTrue(cd.check_override("RAGSTREAM_NOPE__X", "1"))
        merged = cd.apply_overrides({"embedder": {"threads": 1}}, {"RAGSTREAM_EMBEDDER__THREADS": "3"})
        self.assertEqual(merged["embedder"]["threads"], "3")


class Containers(unittest.TestCase):
    def test_run_flags_come_from_the_cli(self):
        self.assertEqual(cd.flag_problems("x", ["run", "--config", "/etc/ragstream/kafka.toml"]), [])
        self.assertTrue(cd.flag_problems("x", ["run", "--bogus"]))
        self.assertTrue(cd.flag_problems("x", ["serve"]))
        self.assertEqual(cd.arg_value(["run", "--workers=2"], "--workers"), "2")

    def test_a_container_config_must_be_reachable_and_on_its_volume(self):
        good = {"http": {"listen": "0.0.0.0:9464"}, "index": {"path": "/data/index"},
                "source": {"kind": "kafka"}}
        self.assertEqual(cd.effective_problems("c", good, 9464, "/data", None), [])
        loopback = dict(good, http={"listen": "127.0.0.1:9464"})
        self.assertTrue(any("loopback" in p for p in cd.effective_problems("c", loopback, 9464, "/data", None)))
        elsewhere = dict(good, index={"path": "/tmp/index"})
        self.assertTrue(any("data volume" in p for p in cd.effective_problems("c", elsewhere, 9464, "/data", None)))
        self.assertTrue(any("--workers" in p for p in cd.effective_problems("c", good, 9464, "/data", 2)))

    def test_features_close_over_cargo_toml_and_configs_name_what_they_need(self):
        table = {"full": ["kafka", "mcp"], "kafka": ["dep:rdkafka", "ragstream-operators/kafka"],
                 "mcp": ["dep:rmcp"], "qdrant-server": []}
        self.assertEqual(cd.feature_closure(["full"], table), {"full", "kafka", "mcp"})
        with self.assertRaises(KeyError):
            cd.feature_closure(["kafak"], table)
        self.assertEqual(cd.needed_features({"source": {"kind": "dir"}}), set())
        self.assertEqual(cd.needed_features({"source": {"kind": "kafka"}, "index": {"kind": "server"}}),
                         {"kafka", "qdrant-server"})

    def test_dockerignore_and_compose_interpolation(self):
        self.assertTrue(cd.ignored("target/debug/x", ["target"]))
        self.assertTrue(cd.ignored("a/b/__pycache__/m.pyc", ["**/__pycache__"]))
        self.assertFalse(cd.ignored("src/main.rs", ["target", "**/__pycache__"]))
        self.assertEqual(cd.interpolate("${PORT:-9464}"), "9464")
        self.assertEqual(cd.interpolate("${UNSET}x$$"), "x$")
        self.assertTrue(cd.labels_match({"app": "r"}, {"app": "r", "tier": "x"}))
        self.assertFalse(cd.labels_match({"app": "r"}, {"app": "q"}))


if __name__ == "__main__":
    unittest.main()
