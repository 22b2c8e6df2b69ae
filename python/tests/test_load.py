# SPDX-License-Identifier: MIT
"""pmla.load, Plugin.backends / diagnostics, and how the registry is found."""
import os
import shutil
import tempfile
import unittest

from _support import environ, pmla


class TestLoad(unittest.TestCase):
    def test_backends(self):
        p = pmla.load()
        names = p.backend_names
        self.assertIn("pmla-cpu", names)
        self.assertIn("pmla", names)
        cpu = [b for b in p.backends if b.name == "pmla-cpu"][0]
        self.assertEqual(cpu.abi_version, "1.1")
        self.assertEqual(cpu.agreed_version, "1.1")
        self.assertTrue(cpu.description)
        self.assertTrue(os.path.exists(cpu.path), cpu.path)
        self.assertIsInstance(p.diagnostics, str)
        self.assertTrue(os.path.exists(p.registry_path), p.registry_path)
        p.close()
        p.close()  # idempotent

    def test_default_plugin_is_shared(self):
        self.assertIs(pmla.default_plugin(), pmla.default_plugin())

    def test_explicit_search_path(self):
        cpu = [b for b in pmla.load().backends if b.name == "pmla-cpu"][0]
        with environ(PMLA_PLUGIN_PATH=None):
            p = pmla.load(cpu.path)
        self.assertIn(cpu.path, p.search_path)
        self.assertIn("pmla-cpu", p.backend_names)

    def test_empty_search_path_names_what_it_found(self):
        with tempfile.TemporaryDirectory() as d, environ(PMLA_PLUGIN_PATH=None):
            p = pmla.load(d)
            self.assertEqual(p.backends, [])
            with self.assertRaises(pmla.InvalidArgument) as cm:
                pmla.Builder(16, backend="pmla-cpu", plugin=p)
            self.assertIn("not on the plugin path", str(cm.exception))
            self.assertIn(d, str(cm.exception))

    def test_unknown_backend(self):
        with self.assertRaises(pmla.InvalidArgument) as cm:
            pmla.Builder(16, backend="no-such-backend")
        self.assertIn("pmla-cpu", cm.exception.message)  # lists what exists

    def test_diagnostics_name_a_file_that_is_not_a_plugin(self):
        p = pmla.load()
        with tempfile.TemporaryDirectory() as d, environ(PMLA_PLUGIN_PATH=None):
            shutil.copy(p.registry_path, os.path.join(d, "not-a-plugin.so"))
            q = pmla.load(d)
            self.assertEqual(q.backends, [])
            self.assertIn("not-a-plugin.so", q.diagnostics)

    def test_bad_registry_env(self):
        with environ(PMLA_REGISTRY_LIB="/nonexistent/libpmla-registry.so.0"):
            with self.assertRaises(pmla.LoadError) as cm:
                pmla.load()
        self.assertIsInstance(cm.exception, OSError)
        self.assertIn("/nonexistent/libpmla-registry.so.0", str(cm.exception))

    def test_build_dir_env_and_plugin_fallback(self):
        reg = pmla.load().registry_path  # <build>/abi/.libs/libpmla-registry.so.0
        build = os.path.dirname(os.path.dirname(os.path.dirname(reg)))
        with environ(PMLA_REGISTRY_LIB=None, PMLA_PLUGIN_PATH=None, PMLA_BUILD_DIR=build):
            p = pmla.load()
        self.assertEqual(os.path.realpath(p.registry_path), os.path.realpath(reg))
        self.assertEqual(p.search_path, os.path.join(build, "plugin", ".libs"))
        self.assertIn("pmla-cpu", p.backend_names)

    def test_a_backend_whose_text_is_not_utf8(self):
        # names and descriptions are a plugin's bytes: text that is not
        # UTF-8 is shown with replacement characters and breaks no listing,
        # lookup or version check of the other backends
        reg = pmla.load().registry_path  # <build>/abi/.libs/libpmla-registry.so.0
        build = os.path.dirname(os.path.dirname(os.path.dirname(reg)))
        mock = os.path.join(build, "tests", ".libs", "mock_odd_backends.so")
        if not os.path.exists(mock):
            self.skipTest("%s is built by make check" % mock)
        cpu = [b for b in pmla.load().backends if b.name == "pmla-cpu"][0]
        with tempfile.TemporaryDirectory() as d, environ(PMLA_PLUGIN_PATH=None):
            shutil.copy(mock, d)
            p = pmla.load(d + os.pathsep + os.path.dirname(cpu.path))
            odd = [b for b in p.backends if b.name == "mock-odd"]
            self.assertEqual([b.description for b in odd], ["odd: Ger\ufffdte (Latin-1)"])
            with self.assertRaises(pmla.InvalidArgument) as cm:
                pmla.Builder(16, backend="pmla-cpuu", plugin=p)
            self.assertIn("mock-odd", cm.exception.message)
            pmla.Builder(4, backend="pmla-cpu", plugin=p, kv_dtype="fp8_e4m3").close()
            p.close()

    def test_close_closes_builders(self):
        p = pmla.load()
        b = pmla.Builder(16, backend="pmla-cpu", max_batch=2, plugin=p)
        p.close()
        with self.assertRaises(pmla.BadState) as cm:
            b.plan([0, 1], block_table=[[0]], kv_lens=[1])
        self.assertIn("closed", str(cm.exception))
        with self.assertRaises(pmla.LoadError):
            p.backends

    def test_builder_info_and_config(self):
        with pmla.Builder(32, backend="pmla-cpu", page_size=16, max_batch=8, max_q_len=2,
                          topk=64, cu_count=2) as b:
            info = b.info
            self.assertEqual(info["cu_count"], 2)
            self.assertEqual(info["max_requests"], 16)
            self.assertEqual(set(info["buffer_bytes"]), {
                "work_meta_data", "work_indptr", "work_info_set", "reduce_indptr",
                "reduce_final_map", "reduce_partial_map", "partial_out", "partial_lse"})
            self.assertGreaterEqual(info["total_bytes"], sum(info["buffer_bytes"].values()))
            self.assertAlmostEqual(b.config["softmax_scale"], pmla.HEAD_DIM ** -0.5, places=7)
            self.assertEqual(len(b.buffer("work_meta_data")), 32)
            self.assertEqual(b.backend, "pmla-cpu")
        self.assertIn("closed", repr(b))


if __name__ == "__main__":
    unittest.main()
