# SPDX-License-Identifier: MIT
"""Every non-OK status raises its pmla.Error subclass carrying last_error's
message; Python-side argument errors raise InvalidArgument."""
import gc
import os
import re
import subprocess
import sys
import threading
import unittest
import weakref

from _support import (HERE, another_thread_inside, cuda_available, need_numpy, need_torch, np, pmla,
                      torch)


def cpu(heads=16, **kw):
    kw.setdefault("max_batch", 2)
    return pmla.Builder(heads, backend="pmla-cpu", **kw)


def planned_step(seed):
    """A pmla-cpu builder planned for one request of 9 tokens on page 0, and
    a q and a one-page cache for it (bf16 bits, seeded)."""
    rng = np.random.default_rng(seed)
    b = cpu(page_size=16)
    b.plan([0, 1], block_table=[[0]], kv_lens=[9])
    q = rng.integers(0x3c00, 0x3f00, size=(1, 16, 576)).astype(np.uint16)
    kv = rng.integers(0xbc00, 0xbf00, size=(1, 16, 576)).astype(np.uint16)
    return b, q, kv


class TestStatusClasses(unittest.TestCase):
    def test_every_status_has_its_class(self):
        names = {1: "InvalidArgument", 2: "Unsupported", 3: "VersionError", 4: "StructSize",
                 5: "Capacity", 6: "NoDevice", 7: "OutOfMemory", 8: "DeviceError",
                 9: "BadState", 10: "DeviceInputError", 11: "InternalError"}
        p = pmla.default_plugin()
        for status, name in names.items():
            cls = pmla.error_class(status)
            self.assertIs(cls, getattr(pmla, name))
            self.assertTrue(issubclass(cls, pmla.Error))
            self.assertEqual(cls.status, status)
            self.assertEqual(cls.status_name, p.status_name(status))
        self.assertTrue(issubclass(pmla.InvalidArgument, ValueError))
        self.assertTrue(issubclass(pmla.Unsupported, NotImplementedError))
        self.assertTrue(issubclass(pmla.OutOfMemory, MemoryError))
        e = pmla.error_class(5)("decode: too many")
        self.assertEqual(str(e), "PMLA_ERR_CAPACITY: decode: too many")

    def test_the_mirror_has_every_status_and_error_bit_of_pmla_h(self):
        header = os.path.join(os.path.dirname(os.path.dirname(HERE)), "abi", "pmla.h")
        with open(header) as f:
            text = f.read()
        statuses = dict((int(v), n) for n, v in re.findall(r"PMLA_(OK|ERR_\w+) = (\d+)", text))
        self.assertEqual(len(statuses), 12)
        for value, name in statuses.items():
            self.assertEqual(getattr(pmla._abi, name), value, name)
        bits = [1 << int(n) for n in re.findall(r"PMLA_DEVERR_\w+ = 1u << (\d+)", text)]
        self.assertEqual(sorted(pmla._abi.DEVERR_BITS), sorted(bits))


class TestInitErrors(unittest.TestCase):
    def test_unsupported_heads(self):
        for heads in (0, 129):
            with self.assertRaises(pmla.Unsupported) as cm:
                cpu(heads)
            self.assertIn("config.num_heads = %d" % heads, cm.exception.message)
            self.assertIn("accepted", cm.exception.message)
            self.assertEqual(cm.exception.call, "init_builder")

    def test_1_1_features_need_a_1_1_backend(self):
        # a backend that agreed ABI 1.0 would ignore config.flags and refuses
        # FP8 caches: the builder says so instead of making a default one
        real = pmla.default_plugin()

        class Old(pmla.Plugin):
            backends = [b._replace(agreed_version="1.0") for b in real.backends]
            backend = staticmethod(real.backend)

            def __init__(self):  # the real plugin's backends, said to agree 1.0
                pass

        for kw in ({"batch_invariant": True}, {"kv_dtype": "fp8_ds_mla"},
                   {"invariant_chunk": 2048}):
            with self.assertRaises(pmla.Unsupported) as cm:
                pmla.Builder(16, backend="pmla-cpu", plugin=Old(), **kw)
            self.assertIn("needs ABI 1.1", cm.exception.message)
            self.assertIn("agreed 1.0", cm.exception.message)
        pmla.Builder(16, backend="pmla-cpu", plugin=real, batch_invariant=True).close()

    def test_invalid_invariant_chunk(self):
        # a multiple of 64 up to 2^20, and only for batch-invariant builders
        for kw, what in (({"batch_invariant": True, "invariant_chunk": 100}, "100; accepted"),
                         ({"invariant_chunk": 2048}, "2048 without PMLA_BUILDER_BATCH_INVARIANT")):
            with self.assertRaises(pmla.InvalidArgument) as cm:
                cpu(**kw)
            self.assertIn("config.invariant_chunk = " + what, cm.exception.message)
        cpu(batch_invariant=True, invariant_chunk=1 << 20).close()

    def test_invalid_page_size(self):
        with self.assertRaises(pmla.InvalidArgument) as cm:
            cpu(page_size=3)
        self.assertIn("config.page_size = 3", str(cm.exception))

    def test_invalid_max_q_len(self):
        with self.assertRaises(pmla.InvalidArgument) as cm:
            cpu(max_q_len=9)
        self.assertIn("config.max_q_len = 9", str(cm.exception))

    def test_invalid_scale(self):
        with self.assertRaises(pmla.InvalidArgument) as cm:
            cpu(softmax_scale=-1.0)
        self.assertIn("softmax_scale", str(cm.exception))
        # the config holds a float32: a value it cannot hold is named as given
        for scale, shown in ((1e39, "1e+39"), (1e-50, "1e-50")):
            with self.assertRaises(pmla.InvalidArgument) as cm:
                cpu(softmax_scale=scale)
            self.assertIn("softmax_scale = %s" % shown, cm.exception.message)

    def test_python_side_values(self):
        for kw in ({"max_batch": -1}, {"page_size": 2 ** 32}, {"topk": 1.5},
                   {"device": "cuda"}, {"kv_dtype": [1]}, {"kv_dtype": 1.0},
                   {"kv_dtype": True}, {"softmax_scale": "x"}, {"softmax_scale": object()}):
            with self.assertRaises(pmla.InvalidArgument, msg=repr(kw)) as cm:
                cpu(**kw)
            self.assertIn(next(iter(kw)), cm.exception.message)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            pmla.Builder(16, backend=5)
        self.assertIn("backend = 5", cm.exception.message)
        # values Python cannot pass on as they are: named, not a bare error
        # of the conversion (a NUL ended the name in C: "pmla-cpu" was made)
        for kw, named in (({"softmax_scale": 10 ** 400}, "softmax_scale"),
                          ({"plugin": 5}, "plugin = 5"),
                          ({"batch_invariant": "no"}, "batch_invariant = 'no'"),
                          ({"batch_invariant": 1}, "batch_invariant = 1 (int)"),
                          ({"backend": "pmla-cpu\0x"}, "backend = 'pmla-cpu\\x00x'"),
                          ({"backend": "\udc80"}, "backend = '\\udc80'")):
            with self.assertRaises(pmla.InvalidArgument, msg=repr(kw)) as cm:
                pmla.Builder(16, **dict({"backend": "pmla-cpu", "max_batch": 2}, **kw))
            self.assertIn(named, cm.exception.message)
        pmla.Builder(16, backend="pmla-cpu", max_batch=2, batch_invariant=np.True_).close()
        for path in (5, "plugins\0junk"):  # C would read the name cut short at the NUL
            with self.assertRaises(pmla.InvalidArgument) as cm:
                pmla.load(path)
            self.assertIn("path = %r" % (path,), cm.exception.message)

    @unittest.skipIf(cuda_available(), "a GPU is present: pmla may initialise")
    def test_no_device(self):
        with self.assertRaises(pmla.NoDevice) as cm:
            pmla.Builder(16, backend="pmla")
        self.assertIn("pmla-cpu", cm.exception.message)  # says what to use instead


class TestStepErrors(unittest.TestCase):
    def test_run_before_plan(self):
        b = cpu()
        with self.assertRaises(pmla.BadState) as cm:
            b.run([0], [0], out=[0], return_lse=False)  # the plugin refuses before reading tensors
        self.assertIn("no step was built", cm.exception.message)
        self.assertEqual(cm.exception.message, b._be.error_message(b._h))  # last_error

    def test_max_seq_len_out_of_range(self):
        b = cpu(topk=4)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            b.plan_sparse([[0, 1, 2, 3]], 2 ** 63)
        self.assertIn("accepted: an int in 0..2^63-1", cm.exception.message)

    def test_sparse_on_dense_builder(self):
        b = cpu()
        with self.assertRaises(pmla.BadState) as cm:
            b.plan_sparse([[0]], 1)
        self.assertIn("topk = 0", cm.exception.message)

    def test_closed(self):
        b = cpu()
        b.close()
        b.close()
        for call in (lambda: b.plan([0, 1], block_table=[[0]], kv_lens=[1]),
                     lambda: b.run([0], [0]), lambda: b.info, b.check_device_error):
            with self.assertRaises(pmla.BadState):
                call()

    def test_capacity(self):
        b = cpu(max_batch=2)
        with self.assertRaises(pmla.Capacity) as cm:
            b.plan([0, 1, 2, 3], block_table=[[0], [0], [0]], kv_lens=[1, 1, 1])
        self.assertIn("exceeds config.max_batch = 2", cm.exception.message)
        self.assertEqual(cm.exception.message, b._be.error_message(b._h))

    def test_layout_arguments(self):
        b = cpu()
        for kw in ({}, {"block_table": [[0]]}, {"kv_indptr": [0, 1], "kv_indices": [0]},
                   {"block_table": [[0]], "kv_lens": [1], "kv_indptr": [0, 1]}):
            with self.assertRaises(pmla.InvalidArgument, msg=repr(kw)) as cm:
                b.plan([0, 1], **kw)
            self.assertIn("block_table and kv_lens", str(cm.exception))

    def test_not_a_tensor(self):
        b = cpu()
        with self.assertRaises(pmla.InvalidArgument) as cm:
            b.plan(object(), block_table=[[0]], kv_lens=[1])
        self.assertIn("plan: qo_indptr", str(cm.exception))
        with self.assertRaises(pmla.InvalidArgument):
            b.plan([0, 1], block_table=[[0], [1, 2]], kv_lens=[1])  # ragged

    def test_bad_lengths_leave_no_step(self):
        b = cpu(page_size=16)
        b.plan([0, 1], block_table=[[0]], kv_lens=[16])
        with self.assertRaises(pmla.InvalidArgument) as cm:
            b.plan([0, 1], block_table=[[0]], kv_lens=[17])
        self.assertIn("kv_lens[0] = 17", cm.exception.message)
        with self.assertRaises(pmla.BadState):
            b.run([0], [0], out=[0], return_lse=False)

    @need_numpy
    def test_dtype_and_shape(self):
        b = cpu(page_size=16)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            b.plan(np.array([0, 1], np.int64), block_table=[[0]], kv_lens=[1])
        self.assertIn("qo_indptr: dtype int64", cm.exception.message)
        b.plan(np.array([0, 1], np.int32), block_table=[[0]], kv_lens=[1])
        kv = np.zeros((1, 16, 576), np.uint16)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            b.run(np.zeros((1, 16, 576), np.float32), kv)
        self.assertIn("args->q: dtype", cm.exception.message)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            b.run(np.zeros((1, 32, 576), np.uint16), kv)
        self.assertIn("args->q: shape", cm.exception.message)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            b.run(np.zeros((1, 16, 576), np.uint16), kv, lse=np.zeros((1, 16), np.float64))
        self.assertIn("args->lse: dtype", cm.exception.message)
        q = np.zeros((1, 16, 576), np.uint16)
        with self.assertRaises(pmla.InvalidArgument) as cm:  # strided
            b.run(q[:, :, ::2], kv, out=np.zeros((1, 16, 512), np.uint16), return_lse=False)
        self.assertIn("args->q", cm.exception.message)
        with self.assertRaises(pmla.InvalidArgument) as cm:  # out sized from q: refused first
            b.run(q[:, :, ::2], kv)
        self.assertIn("run: q has shape (1, 16, 288)", cm.exception.message)

    @need_numpy
    def test_page_index_outside_cache(self):
        b = cpu(page_size=16)
        b.plan([0, 1], block_table=[[5]], kv_lens=[3])
        q = np.zeros((1, 16, 576), np.uint16)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            b.run(q, np.zeros((2, 16, 576), np.uint16))
        self.assertIn("page 0 of request 0 is 5", cm.exception.message)
        self.assertEqual(b.check_device_error(), 0)

    @need_numpy
    def test_sparse_slot_outside_cache(self):
        b = cpu(page_size=16, topk=4)
        b.plan_sparse(np.array([[0, 1, -1, 40]], np.int32), 40)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            b.run(np.zeros((1, 16, 576), np.uint16), np.zeros((2, 16, 576), np.uint16))
        self.assertIn("topk_indices[0][3] = 40", cm.exception.message)
        with self.assertRaises(pmla.InvalidArgument):
            b.plan_sparse(np.array([[0, 1, 2]], np.int32), 4)  # width != topk
        with self.assertRaises(pmla.InvalidArgument):
            b.plan_sparse(np.array([[0, 1, 2, 3]], np.int32), -1)

    @need_torch
    def test_out_required_for_foreign_inputs(self):
        b = cpu(page_size=16)
        b.plan([0, 1], block_table=[[0]], kv_lens=[1])
        import torch.utils.dlpack as tdl
        q = tdl.to_dlpack(torch.zeros(1, 16, 576, dtype=torch.bfloat16))
        with self.assertRaises(pmla.InvalidArgument) as cm:
            b.run(q, torch.zeros(1, 16, 576, dtype=torch.bfloat16))
        self.assertIn("out and lse are required", cm.exception.message)

    @need_torch
    def test_used_capsule(self):
        import torch.utils.dlpack as tdl
        cap = tdl.to_dlpack(torch.zeros(2, dtype=torch.int32))
        torch.utils.dlpack.from_dlpack(cap)  # consumes it
        with self.assertRaises(pmla.InvalidArgument) as cm:
            cpu().plan(cap, block_table=[[0]], kv_lens=[1])
        self.assertIn("used once", cm.exception.message)


@need_numpy
class TestRefusedRunsChangeNothing(unittest.TestCase):
    """A refused run raises InvalidArgument and leaves the builder as it
    was: the next run reads the tensors it read before. A refused plan,
    refused here or by the plugin, leaves no step."""

    def setUp(self):
        self.b, self.q, self.kv = planned_step(3)
        self.out, self.lse = self.b.run(self.q, self.kv)

    def test_required_tensors(self):
        for args, name in (((None, self.kv), "q"), ((np.zeros_like(self.q), None), "kv_cache")):
            with self.assertRaises(pmla.InvalidArgument) as cm:
                self.b.run(*args)
            self.assertIn("run: %s is None" % name, cm.exception.message)
        out, lse = self.b.run(self.q, self.kv)  # the run before, not the refused q
        self.assertTrue(np.array_equal(out, self.out) and np.array_equal(lse, self.lse))
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.plan(None, block_table=[[0]], kv_lens=[1])
        self.assertIn("plan: qo_indptr is None", cm.exception.message)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            cpu(topk=4).plan_sparse(None, 1)
        self.assertIn("plan_sparse: topk_indices is None", cm.exception.message)

    def test_a_plan_refused_here_leaves_no_step(self):
        refusals = (lambda b: b.plan([0, 1], block_table=[[0]]),  # no kv_lens
                    lambda b: b.plan([0, 1], block_table=[[0]], kv_lens=[1.5]),
                    lambda b: b.plan([0, 1], block_table=[[0]], kv_lens=object()),
                    lambda b: b.plan_sparse(np.zeros((1, 4), np.int32), "9"))
        for i, refuse in enumerate(refusals):
            b = cpu(page_size=16, topk=4 if i == 3 else 0)
            if i == 3:
                b.plan_sparse(np.zeros((1, 4), np.int32), 9)
            else:
                b.plan([0, 1], block_table=[[0]], kv_lens=[9])
            with self.assertRaises(pmla.InvalidArgument, msg=str(i)):
                refuse(b)
            with self.assertRaises(pmla.BadState, msg=str(i)) as cm:
                b.run(self.q, self.kv)
            self.assertIn("the last plan was refused", cm.exception.message)
        self.b.plan([0, 1], block_table=[[0]], kv_lens=[9])  # planned again: runs again
        out, lse = self.b.run(self.q, self.kv)
        self.assertTrue(np.array_equal(out, self.out) and np.array_equal(lse, self.lse))

    def test_read_only_outputs(self):
        for name in ("out", "lse"):
            dst = np.full(self.out.shape if name == "out" else self.lse.shape, 7,
                          np.uint16 if name == "out" else np.float32)
            dst.setflags(write=False)
            with self.assertRaises(pmla.InvalidArgument, msg=name) as cm:
                self.b.run(self.q, self.kv, **{name: dst})
            self.assertIn("run: %s: a read-only array" % name, cm.exception.message)
            self.assertTrue((dst == 7).all())
        frozen = bytes(16 * 512 * 2)
        with self.assertRaises(pmla.InvalidArgument):
            self.b.run(self.q, self.kv, out=np.frombuffer(frozen, np.uint16).reshape(1, 16, 512))
        self.assertEqual(frozen, bytes(16 * 512 * 2))
        q, kv = self.q.copy(), self.kv.copy()  # read-only inputs are fine
        q.setflags(write=False)
        kv.setflags(write=False)
        out, _ = self.b.run(q, kv)
        self.assertTrue(np.array_equal(out, self.out))

    def test_lists_are_read_every_time(self):
        lens, table = [9], [[0]]
        kv = np.concatenate([self.kv, self.kv[:, ::-1]])
        self.b.plan([0, 1], block_table=table, kv_lens=lens)
        first, _ = self.b.run(self.q, kv)
        lens[0], table[0][0] = 14, 1  # changed in place, planned again
        self.b.plan([0, 1], block_table=table, kv_lens=lens)
        changed, _ = self.b.run(self.q, kv)
        self.b.plan([0, 1], block_table=[[1]], kv_lens=[14])
        fresh, _ = self.b.run(self.q, kv)
        self.assertTrue(np.array_equal(changed, fresh))
        self.assertFalse(np.array_equal(changed, first))
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.plan([0, 1], block_table=[[0, 1 + 2 ** 32]], kv_lens=[9])
        self.assertIn("block_table: element 1 is 4294967297", cm.exception.message)

    def test_layout_changed_in_place(self):
        q = self.q.copy()
        self.b.run(q, self.kv)
        q.shape = (16, 1, 576)  # same memory, another shape: read again, and refused
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.run(q, self.kv)
        self.assertIn("args->q: shape", cm.exception.message)

    @need_torch
    def test_torch_layout_changed_in_place(self):
        q = torch.from_numpy(self.q.view(np.int16).copy()).view(torch.bfloat16)
        kv = torch.from_numpy(self.kv.view(np.int16).copy()).view(torch.bfloat16)
        out = torch.empty(1, 16, 512, dtype=torch.bfloat16)
        self.b.run(q, kv, out=out)
        q.transpose_(0, 1)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.run(q, kv, out=out)
        self.assertIn("args->q", cm.exception.message)

    @need_torch
    def test_capsule_is_consumed(self):
        import torch.utils.dlpack as tdl
        lens = torch.tensor([9], dtype=torch.int32)
        cap = tdl.to_dlpack(lens)
        self.b.plan([0, 1], block_table=[[0]], kv_lens=cap)
        with self.assertRaises(Exception):  # used: no second consumer takes it
            tdl.from_dlpack(cap)
        del lens, cap
        gc.collect()
        out, _ = self.b.run(self.q, self.kv)  # pmla still holds the lengths' memory
        self.assertTrue(np.array_equal(out, self.out))


@need_numpy
class TestExporters(unittest.TestCase):
    """Whatever a tensor's exporter does, pmla reads only memory it was
    given, and refuses what it cannot take with InvalidArgument naming the
    argument."""

    def setUp(self):
        self.b, self.q, self.kv = planned_step(5)

    def test_array_interface_data_must_be_a_pointer_tuple(self):
        class Buffer:  # data as a buffer object, which the protocol allows
            __array_interface__ = {"shape": (2,), "typestr": "<i4", "version": 3,
                                   "data": bytearray(b"\x40" * 8)}
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.plan(Buffer(), block_table=[[0]], kv_lens=[1])
        self.assertIn("plan: qo_indptr: __array_interface__ data bytearray(b'@@@@@@@@')",
                      cm.exception.message)
        for data in ((-5, False), (2 ** 64, False)):  # named as given, not "of type tuple"
            Buffer.__array_interface__ = dict(Buffer.__array_interface__, data=data)
            with self.assertRaises(pmla.InvalidArgument) as cm:
                self.b.plan(Buffer(), block_table=[[0]], kv_lens=[1])
            self.assertIn("data %r; accepted" % (data,), cm.exception.message)
        good = np.array([0, 1], np.int32)
        for change, text in (({"typestr": 5}, "array type 5"),
                             ({"shape": ("a",)}, "shape ('a',)"),
                             ({"shape": (2 ** 64,)}, "shape (18446744073709551616,)"),
                             ({"strides": (4, 4)}, "strides (4, 4); accepted: a tuple of 1"),
                             ({"data": None}, "data missing")):
            ai = dict(good.__array_interface__, **change)
            obj = type("Malformed", (), {"__array_interface__": ai})()
            with self.assertRaises(pmla.InvalidArgument, msg=str(change)) as cm:
                self.b.plan(obj, block_table=[[0]], kv_lens=[1])
            self.assertIn(text, cm.exception.message)

    def test_exporter_errors_name_the_argument(self):
        class NotACapsule:
            def __dlpack__(self, *a, **k):
                return 42

        class Raises:
            @property
            def __array_interface__(self):
                raise RuntimeError("boom")
        for obj, text in ((NotACapsule(), "q: NotACapsule.__dlpack__() returned a int"),
                          (Raises(), "q: reading Raises's __array_interface__ failed: "
                                     "RuntimeError: boom")):
            with self.assertRaises(pmla.InvalidArgument) as cm:
                self.b.run(obj, self.kv)
            self.assertIn(text, cm.exception.message)

    def test_other_exporters_are_read_again_every_call(self):
        class Holder:  # exports whatever array it holds now
            def __init__(self, a):
                self.a = a

            @property
            def __array_interface__(self):
                return self.a.__array_interface__
        first, second = (np.zeros((1, 16, 512), np.uint16) for _ in range(2))
        out = Holder(first)
        self.b.run(self.q, self.kv, out=out, return_lse=False)
        self.assertTrue(first.any())
        first[...] = 0
        out.a = second
        self.b.run(self.q, self.kv, out=out, return_lse=False)
        self.assertTrue(second.any())
        self.assertFalse(first.any())  # not written through the first export
        kv = Holder(np.zeros((64, 16, 576), np.uint16))
        self.b.run(self.q, kv, out=first, return_lse=False)
        kv.a = self.kv  # the first cache freed: never read again
        gc.collect()
        self.b.run(self.q, kv, out=first, return_lse=False)
        want, _ = self.b.run(self.q, self.kv)
        self.assertTrue(np.array_equal(first, want))

    def test_a_capsule_without_its_shape_is_refused(self):
        import ctypes
        from pmla import _abi

        class Managed(ctypes.Structure):  # DLManagedTensor, no deleter
            _fields_ = [("dl", _abi.DLTensor), ("ctx", ctypes.c_void_p),
                        ("deleter", ctypes.c_void_p)]
        data = np.array([0, 1], np.int32)
        m = Managed()
        m.dl.data = data.ctypes.data
        m.dl.device.device_type = _abi.kDLCPU
        m.dl.ndim = 1  # and shape left NULL
        m.dl.dtype.code, m.dl.dtype.bits, m.dl.dtype.lanes = _abi.kDLInt, 32, 1
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                       ctypes.c_void_p]
        cap = new(ctypes.addressof(m), b"dltensor", None)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.plan(cap, block_table=[[0]], kv_lens=[9])
        self.assertIn("plan: qo_indptr: a DLPack tensor of ndim 1, shape NULL",
                      cm.exception.message)

    def test_bools_are_not_ints(self):
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.plan([False, True], block_table=[[0]], kv_lens=[9])
        self.assertIn("plan: qo_indptr: element 0 is False; accepted: a list of ints",
                      cm.exception.message)
        with self.assertRaises(pmla.InvalidArgument):
            self.b.plan([0, 1], block_table=[[np.bool_(False)]], kv_lens=[9])

    def test_list_errors_name_the_element(self):
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.plan([0, 1], block_table=[[0], [1, 2]], kv_lens=[9])
        self.assertIn("block_table: row 1 is 2 long where row 0 has 1 elements",
                      cm.exception.message)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.plan([0, 1], block_table=[[0], 7], kv_lens=[9])
        self.assertIn("block_table: row 1 is of type int", cm.exception.message)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.plan([0, 1], block_table=[[0]], kv_lens=["9"])
        self.assertIn("kv_lens: element 0 is '9'", cm.exception.message)

    def test_a_broadcast_q_is_refused_before_outputs_are_sized(self):
        huge = np.broadcast_to(self.q, (2 ** 31, 16, 576))  # 2^31 tokens in one row
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.run(huge, self.kv)
        self.assertIn("run: q: stride 0 in dim 0; accepted: contiguous row-major",
                      cm.exception.message)
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.run(np.zeros((2 ** 26, 16, 1), np.uint16), self.kv)  # out would be 1 TiB
        self.assertIn("run: q has shape (67108864, 16, 1); accepted: [tokens, heads, 576]",
                      cm.exception.message)

    def test_a_writable_flag_cleared_in_place_is_noticed(self):
        out = np.full((1, 16, 512), 7, np.uint16)
        self.b.run(self.q, self.kv, out=out)
        out[...] = 7
        out.flags.writeable = False
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.run(self.q, self.kv, out=out)
        self.assertIn("run: out: a read-only array", cm.exception.message)
        self.assertTrue((out == 7).all())

    def test_numpy_integers_are_ints(self):
        b = pmla.Builder(np.int64(16), backend="pmla-cpu", page_size=np.int32(16),
                         max_batch=np.uint8(2), topk=8)
        self.assertEqual((b.config["num_heads"], b.config["page_size"]), (16, 16))
        self.assertIs(type(b.config["max_batch"]), int)
        b.plan_sparse(np.zeros((1, 8), np.int32), np.array([3, 5]).max())
        with self.assertRaises(pmla.InvalidArgument):
            pmla.Builder(True, backend="pmla-cpu")

    def test_stream_handles_beyond_64_bits_are_refused(self):
        for bad in (2 ** 64 + 1, -1):
            with self.assertRaises(pmla.InvalidArgument) as cm:
                self.b.run(self.q, self.kv, stream=bad)
            self.assertIn("stream: %d" % bad, cm.exception.message)

    @need_torch
    def test_a_torch_subclass_is_a_torch_tensor(self):
        class Sub(torch.Tensor):
            pass
        q = torch.from_numpy(self.q.view(np.int16).copy()).view(torch.bfloat16).as_subclass(Sub)
        kv = torch.from_numpy(self.kv.view(np.int16).copy()).view(torch.bfloat16)
        out, lse = self.b.run(q, kv)  # allocated with torch, as for a plain tensor
        self.assertEqual(tuple(out.shape), (1, 16, 512))
        mine = torch.empty(1, 16, 512, dtype=torch.bfloat16).as_subclass(Sub)
        self.b.run(q, kv, out=mine)
        self.assertTrue(torch.equal(mine, out))
        mine.resize_(256, 16, 512)  # new storage; the old one is freed
        with self.assertRaises(pmla.InvalidArgument) as cm:
            self.b.run(q, kv, out=mine)
        self.assertIn("args->out: shape [256, 16, 512]", cm.exception.message)

    @need_torch
    def test_empty_torch_tensors_are_accepted(self):
        # torch gives a dimension of 0 stride 1, which is not row-major
        table = torch.zeros((2, 0), dtype=torch.int32)
        self.assertEqual(table.stride(), (1, 1))
        b = cpu(page_size=16)
        b.plan([0, 1, 2], block_table=table, kv_lens=torch.zeros(2, dtype=torch.int32))
        q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
        out, lse = b.run(q, torch.zeros(1, 16, 576, dtype=torch.bfloat16))
        self.assertTrue(torch.isneginf(lse).all())


class TestThreads(unittest.TestCase):
    """One builder is used by one thread at a time (pmla.h): a call from a
    second thread while one is inside is refused, not run beside it."""

    @need_numpy
    def test_a_builder_in_use_refuses_other_threads(self):
        b, q, kv = planned_step(3)
        entered, release = threading.Event(), threading.Event()

        class Gate:
            """q through DLPack, once the test lets it go: holds its caller
            inside run()"""

            def __dlpack__(self, *args, **kw):
                entered.set()
                release.wait(30)
                return q.__dlpack__(*args, **kw)

        out, lse = np.empty((1, 16, 512), np.uint16), np.empty((1, 16), np.float32)
        with another_thread_inside(lambda: b.run(Gate(), kv, out, lse), entered, release):
            for call, fn in (("run", lambda: b.run(q, kv)),
                             ("plan", lambda: b.plan([0, 1], block_table=[[0]], kv_lens=[9])),
                             ("info", lambda: b.info), ("close", b.close)):
                with self.assertRaises(pmla.BadState, msg=call) as cm:
                    fn()
                self.assertIn("%s: the builder is in use by another thread" % call,
                              cm.exception.message)
        again, again_lse = b.run(q, kv)  # the builder is whole, and free again
        np.testing.assert_array_equal(again, out)
        np.testing.assert_array_equal(again_lse, lse)
        b.close()

    def test_a_builder_finalised_while_another_is_destroyed(self):
        # the cycle collector may finalise a builder (its close()) while this
        # thread destroys another inside the registry's lock: that close()
        # must not wait for the lock its own thread holds
        p = pmla.load()
        b1, b2 = (pmla.Builder(16, backend="pmla-cpu", max_batch=2, plugin=p) for _ in "ab")
        reg = b2._be.registry
        destroy = reg._live[b2._h]

        def destroy_while_b1_is_finalised(handle):
            b1.close()  # what b1.__del__ does when the collector runs here
            destroy(handle)

        reg._live[b2._h] = destroy_while_b1_is_finalised
        t = threading.Thread(target=b2.close, daemon=True)
        t.start()
        t.join(30)
        self.assertFalse(t.is_alive(), "b2.close() waited for the registry's lock forever")
        self.assertEqual((b1._h, b2._h), (None, None))
        self.assertEqual(reg._live, {})
        p.close()


class TestLifetimes(unittest.TestCase):
    """The registry closes when nothing uses it, and never under a builder."""

    def test_a_plugin_goes_with_its_last_reference(self):
        gc.disable()  # some servers run with the collector off or frozen
        try:
            p = pmla.load()
            p.backend("pmla-cpu")
            gone = weakref.ref(p)
            del p
            self.assertIsNone(gone())
        finally:
            gc.enable()

    def test_a_cycle_of_plugin_and_builder_is_collected_safely(self):
        # the collector may finalise the plugin first; the builder's
        # destruction must not run in unloaded plugin code
        code = ("import gc, pmla\n"
                "class Host: pass\n"
                "for _ in range(3):\n"
                "    h = Host(); h.me = h; h.p = pmla.load()\n"
                "    h.b = pmla.Builder(16, backend='pmla-cpu', max_batch=2, plugin=h.p)\n"
                "    del h; gc.collect()\n"
                "print('collected')\n")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.dirname(os.path.dirname(pmla.__file__))] +
            ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=120)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "collected"), r.stderr[-2000:])

    def test_a_plugin_closed_while_a_builder_is_made(self):
        # the plugin's code is not unloaded under init_builder: the builder
        # is refused (the close came first) or made and closed with it
        p = pmla.load()

        class Closes:
            def __index__(self):
                p.close()
                return 0

        with self.assertRaisesRegex(pmla.LoadError, "closed"):
            pmla.Builder(16, backend="pmla-cpu", max_batch=2, plugin=p, device=Closes())
        made = refused = 0
        for _ in range(20):
            p = pmla.load()
            stop, built = threading.Event(), []

            def build():
                while not stop.is_set():
                    try:
                        built.append(pmla.Builder(16, backend="pmla-cpu", max_batch=2,
                                                  cu_count=1, plugin=p))
                    except pmla.LoadError:
                        return

            t = threading.Thread(target=build)
            t.start()
            while not built and t.is_alive():
                pass
            p.close()
            stop.set()
            t.join(60)
            self.assertFalse(t.is_alive())
            for b in built:  # every one closed with its plugin
                with self.assertRaises(pmla.BadState):
                    b.plan([0, 1], block_table=[[0]], kv_lens=[1])
            made += len(built)
            refused += 1
        self.assertGreater(made, 0)

    def test_close_destroys_builders_once(self):
        p = pmla.load()
        b = pmla.Builder(16, backend="pmla-cpu", max_batch=2, plugin=p)
        p.close()
        b.close()  # already destroyed with the registry: nothing to do
        with self.assertRaises(pmla.BadState):
            b.plan([0, 1], block_table=[[0]], kv_lens=[1])


if __name__ == "__main__":
    unittest.main()
