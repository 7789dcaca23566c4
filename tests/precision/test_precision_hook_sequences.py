"""The two op hooks number the same ops: a program captured through the Python dispatch mode and
through the C++ op observer gives the same op records (op, overload, call number, module, phase,
step), for the kinds of calls where what a RecordFunction observer sees and what a dispatch mode
sees part ways:
- torch's own shallow copies of a tensor (autograd saving an op's result, ``.data``): with a mode
  active they ask the mode for a ``detach`` outside the dispatcher, which the program without a
  mode never calls (not numbered by either hook); a ``detach`` the program or autograd calls
  through the dispatcher (``x.detach()``, AccumulateGrad's) is numbered by both, the one of a
  Parameter made (``torch.Tensor._make_subclass``, with dispatch modes put aside) by neither;
- a ``_foreach_*`` kernel's per-tensor slow path on the CPU (inner calls of the kernel, which run
  with only the autograd keys excluded): not numbered;
- a custom op without an autograd kernel (torch's autograd fallback calls its backend kernel with
  no key excluded): the ops its kernel calls are not numbered;
- an op with a CompositeImplicitAutograd kernel and a backend kernel (``silu_backward``): the
  backend kernel runs, the op is not decomposed: numbered; a factory called with no tensor (the
  ``zeros`` of ``slice_backward``; no autograd kernel runs for it): its inner ``empty`` and
  ``zero_`` are not;
- sdpa's math path with a mask and dropout: the same ops at the same numbers, except the masking
  add, which the kernel runs in place (``add_``) without a mode and out of place (``add``) under
  one (torch takes out-of-place paths when a dispatch mode is active): the one op the mode changes.
Each program runs on the CPU, built afresh (same seed) for each hook."""
import pytest
import torch
import torch.nn.functional as F

from ditorch_precision import Capture, native
from ditorch_precision.dump import Dump

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not native.available(), reason=f"C++ module not built: {native.why_not()}")]

FIELDS = ("index", "op", "overload", "phase", "module", "step")


def _records(tmp_path, hook: str, program) -> list[tuple]:
    torch.manual_seed(0)
    run = program()
    path = tmp_path / hook
    with Capture(str(path), mode="full", hook=hook) as cap:
        run()
    assert cap.hook_used == hook
    assert "_make_subclass" not in vars(torch.Tensor)  # torch as it was (the C++ hook sets its own)
    return [tuple(r[k] for k in FIELDS) for r in Dump.open(str(path)).op_records]


def _both(tmp_path, program) -> tuple[list, list]:
    return _records(tmp_path, "python", program), _records(tmp_path, "cpp", program)


def _saved_results():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)

    def run():
        y = torch.tanh(lin(x)).exp()  # tanh and exp save their results for backward
        y.sum().backward()
        x.detach().mul(2)  # the program's own detach
        lin.weight.data.mul(2)  # .data: a shallow copy, no op
        torch.nn.Parameter(torch.ones(3)).mul(2)
    return run


def test_detaches_of_saved_results_are_numbered_by_neither_hook(tmp_path):
    python, cpp = _both(tmp_path, _saved_results)
    assert python == cpp
    # AccumulateGrad's (x, weight, bias: a new gradient is kept detached), then the program's own
    assert [r[1:4] for r in cpp if r[1] == "aten::detach"] == [
        ("aten::detach", "default", "backward")] * 3 + [("aten::detach", "default", "forward")]


def _foreach():
    params = [torch.randn(3, requires_grad=True), torch.randn(2, 2), torch.randn(5, dtype=torch.float64)]
    opt = torch.optim.SGD(params[:1], lr=0.1, momentum=0.9, foreach=True)

    def run():
        with torch.no_grad():
            torch._foreach_mul_(params, 2.0)
            torch._foreach_add(params, params, alpha=0.5)
        params[0].sum().backward()
        opt.step()
    return run


def test_a_foreach_slow_paths_per_tensor_ops_are_numbered_by_neither_hook(tmp_path):
    python, cpp = _both(tmp_path, _foreach)
    assert python == cpp
    ops = [r[1] for r in cpp]
    assert "aten::_foreach_mul_" in ops and "aten::_foreach_add" in ops
    assert "aten::mul_" not in ops and "aten::add" not in ops


_LIB = None


def _custom_op():
    global _LIB
    if _LIB is None:  # one library per process: a namespace is defined once
        _LIB = torch.library.Library("hookseq", "DEF")
        _LIB.define("twice(Tensor x) -> Tensor")
        _LIB.impl("twice", lambda x: x.clone().mul(2), "CPU")
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)

    def run():
        torch.ops.hookseq.twice(x).add(1)
        torch.ops.hookseq.twice(w)  # through torch's autograd fallback (warns: no autograd kernel)
    return run


@pytest.mark.filterwarnings("ignore:.*autograd kernel was not registered")
def test_a_custom_ops_inner_ops_are_numbered_by_neither_hook(tmp_path):
    python, cpp = _both(tmp_path, _custom_op)
    assert python == cpp
    assert [r[1] for r in cpp] == ["hookseq::twice", "aten::add", "hookseq::twice"]


def _silu_and_slices():
    x = torch.randn(2, 6, requires_grad=True)

    def run():
        (F.silu(x)[:, 1:4] * 2).sum().backward()
    return run


def test_an_op_not_decomposed_is_numbered_and_a_factorys_inner_ops_are_not(tmp_path):
    python, cpp = _both(tmp_path, _silu_and_slices)
    assert python == cpp
    ops = [r[1] for r in cpp]
    assert {"aten::silu_backward", "aten::slice_backward"} <= set(ops)
    assert "aten::empty" not in ops and "aten::zero_" not in ops


class _Attention(torch.nn.Module):
    def forward(self, q, mask):
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask, dropout_p=0.1)


def _sdpa_dropout():
    attention = _Attention()
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    mask = torch.zeros(1, 1, 4, 4).masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf"))

    def run():
        attention(q, mask).sum().backward()
    return run


def test_sdpa_with_dropout_is_numbered_alike_and_only_its_masking_add_differs(tmp_path):
    python, cpp = _both(tmp_path, _sdpa_dropout)
    assert len(python) == len(cpp)
    differ = [(p, c) for p, c in zip(python, cpp) if p != c]
    assert [(p[1], c[1]) for p, c in differ] == [("aten::add", "aten::add_")]
    (p, c), = differ
    assert p[:1] + p[2:] == c[:1] + c[2:] and c[3:5] == ("forward", "_Attention")
    assert "aten::bernoulli_" in [r[1] for r in cpp]


def _checkpointed():
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)

    def run():  # heteropp's recompute: a block under non-reentrant activation checkpointing
        torch.utils.checkpoint.checkpoint(lambda t: torch.tanh(lin(t)), x, use_reentrant=False).sum().backward()
    return run


@pytest.mark.xfail(strict=True, reason=(
    "not numbered alike yet: in the recompute, the detaches checkpoint's pack hook makes of addmm's "
    "inputs (in addmm's autograd kernel, before its kernel) come before addmm in the Python hook "
    "(which sees addmm below autograd) and after it in the C++ observer (which numbers it on entry); "
    "the tanh whose saved result stops the recompute (checkpoint raises from its autograd kernel) is "
    "recorded by the Python hook and counted but dropped by the C++ observer"))
def test_a_checkpointed_blocks_recompute_is_numbered_alike(tmp_path):
    python, cpp = _both(tmp_path, _checkpointed)
    assert python == cpp


def test_a_make_subclass_of_torch_tensors_own_is_still_called_and_put_back(tmp_path):
    # another library's own torch.Tensor._make_subclass: the C++ hook pauses around it, not past it
    made = []
    base = torch._C.TensorBase._make_subclass

    def theirs(*args, **kwargs):
        made.append(args[0])
        return base(*args, **kwargs)

    own = staticmethod(theirs)
    torch.Tensor._make_subclass = own
    try:
        with Capture(str(tmp_path / "cpp"), mode="full", hook="cpp"):
            p = torch.nn.Parameter(torch.ones(3))
        assert made == [torch.nn.Parameter] and isinstance(p, torch.nn.Parameter)
        assert vars(torch.Tensor)["_make_subclass"] is own
    finally:
        del torch.Tensor._make_subclass
