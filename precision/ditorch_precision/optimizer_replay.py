"""An optimizer step judged by replaying it. Adam-like optimizers divide each element's step by its
gradient's root mean square, so an element whose gradient is near ``eps`` turns another rounding of
that gradient (an honest kernel's) into a visibly different step: the parameters after a step can
differ between honest runs far beyond the drift their gradients carry. A full capture therefore also
records what each step started from (``INPUTS_OP``: the parameters, their gradients and the
optimizer's state) with a description of the optimizer (``FILE``: class, hyperparameters, layout),
and a compare replays the step with torch's own implementation of that optimizer (its single-tensor
loop, float64, on the CPU) from each run's own inputs, judging each run's parameters after the step
against its own replay (the error-ratio rule): a device's optimizer that computes something else
fails, one whose inputs merely drifted passes. The hyperparameters of the two runs are compared as
arguments (a changed learning rate is no drift)."""
from __future__ import annotations

import itertools
import json
import math
import os
from typing import Iterator

import torch

from .align import INPUTS_OP
from .dump import checked_lines

FILE = "optimizer_steps.jsonl"
# Group options that choose how torch computes a step, not what: the replay takes its single-tensor
# loop, and the runs may differ in them (fused against foreach kernels is an honest pair).
IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable", "differentiable")


class NotReplayable(Exception):
    """Why a captured step cannot be replayed (said in the compare's row)."""


def _plain(value):
    """A hyperparameter or state value as JSON data; None for what is no plain value (the step is
    then not replayable). A one-element tensor (a tensor learning rate) is its number."""
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)  # JSON has no inf: "inf", read back below
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return None if any(i is None and v is not None for i, v in zip(items, value)) else items
    return None


def describe(optimizer: torch.optim.Optimizer) -> tuple[dict, list[torch.Tensor]]:
    """The description of a step about to run and the tensors it starts from, in order (the program's
    own, not detached): for each parameter (group by group) the parameter, its gradient when it has one,
    then its state tensors by key."""
    cls = type(optimizer)
    desc: dict = {"optimizer": f"{cls.__module__}.{cls.__qualname__}", "groups": [], "params": []}
    unplain: list[str] = []
    tensors: list[torch.Tensor] = []
    for g, group in enumerate(optimizer.param_groups):
        hyper = {}
        for key, value in group.items():
            if key == "params":
                continue
            hyper[key] = plain = _plain(value)
            if plain is None and value is not None:
                unplain.append(f"group {g} option {key!r} ({type(value).__name__})")
        desc["groups"].append({"n_params": len(group["params"]), "hyper": hyper})
        for p in group["params"]:
            tensors.append(p)
            if p.grad is not None:
                tensors.append(p.grad)
            state = {}
            for key, value in optimizer.state.get(p, {}).items():
                if not isinstance(key, str):
                    unplain.append(f"a state key of type {type(key).__name__}")
                elif isinstance(value, torch.Tensor):
                    state[key] = "tensor"
                    tensors.append(value)
                else:
                    plain = _plain(value)
                    if plain is None and value is not None:
                        unplain.append(f"state {key!r} ({type(value).__name__})")
                    state[key] = {"value": plain}
            desc["params"].append({"grad": p.grad is not None, "state": state})
    if unplain:
        desc["not_replayable"] = "not plain data: " + ", ".join(unplain[:3])
    return desc, tensors


class StepLog:
    """A capture's ``FILE``: one line a recorded step (appended as the step starts)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, FILE)
        self._f = None

    def write(self, step: int, rank: int, desc: dict) -> None:
        if self._f is None:
            self._f = open(self.path, "w")
        self._f.write(json.dumps({"step": step, "rank": rank, **desc}) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class StepReader:
    """A capture's ``FILE`` read forward (a compare asks for its steps in order): ``get(step)`` is
    that step's description or None; each line is checked, as data from another run trusted for no
    count. Only the line asked for is held, so a compare's memory does not grow with the steps."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, FILE)
        self._lines = None
        self._asked = -1  # the last step asked for
        self._current: dict | None = None  # the first line not before it

    def get(self, step) -> dict | None:
        if not isinstance(step, int) or not os.path.isfile(self.path):
            return None
        if self._lines is None or step < self._asked:  # from the start
            self._lines, self._current = checked_lines(self.path, _bad_description), None
        self._asked = step
        while self._current is None or self._current["step"] < step:
            self._current = next(self._lines, None)
            if self._current is None:
                return None
        return self._current if self._current["step"] == step else None


def inputs_record(records: list[dict], step) -> dict | None:
    """The ``INPUTS_OP`` record of a step among its records."""
    return next((r for r in records if r.get("kind") == "module" and r["op"] == INPUTS_OP and r.get("step") == step),
                None)


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _bad_description(d) -> str | None:
    if not isinstance(d, dict):
        return "expected a JSON object"
    if not _is_count(d.get("step")) or not isinstance(d.get("optimizer"), str):
        return "expected 'step' (a count) and 'optimizer' (a class name)"
    if "index" in d and not _is_count(d["index"]):
        return f"'index' is {d['index']!r:.40}, expected a call number"
    groups, params = d.get("groups"), d.get("params")
    if not isinstance(groups, list) or not isinstance(params, list):
        return "expected lists 'groups' and 'params'"
    for g in groups:
        if not isinstance(g, dict) or not _is_count(g.get("n_params")) or not isinstance(g.get("hyper"), dict):
            return "a group without 'n_params' (a count) and 'hyper' (an object)"
    if sum(g["n_params"] for g in groups) != len(params):
        return f"the groups hold {sum(g['n_params'] for g in groups)} parameters, 'params' describes {len(params)}"
    for p in params:
        if not isinstance(p, dict) or not isinstance(p.get("grad"), bool) or not isinstance(p.get("state"), dict):
            return "a parameter without 'grad' (true or false) and 'state' (an object)"
        for v in p["state"].values():
            if v != "tensor" and not (isinstance(v, dict) and set(v) == {"value"}):
                return "a state value neither \"tensor\" nor {\"value\": ...}"
    return None


def _per_parameter(desc: dict) -> list[int]:
    """How many of the ``INPUTS_OP`` record's tensors each parameter has (itself, its gradient, its state)."""
    return [1 + p["grad"] + sum(v == "tensor" for v in p["state"].values()) for p in desc["params"]]


# torch.optim's classes whose step updates each parameter from its own gradient and state alone (not
# LBFGS, which evaluates the loss again): replayed a parameter at a time.
PER_PARAMETER = frozenset({"SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop",
                           "Rprop", "ASGD", "Adafactor", "SparseAdam", "Muon"})


def _torch_optimizer(name: str) -> type:
    """torch's own optimizer class of that name: looked up among torch.optim's, never imported."""
    module, _, cls_name = name.rpartition(".")
    cls = getattr(torch.optim, cls_name, None)
    if (not module.startswith("torch.optim") or not isinstance(cls, type)
            or not issubclass(cls, torch.optim.Optimizer) or f"{cls.__module__}.{cls.__qualname__}" != name):
        raise NotReplayable(f"optimizer {name} is not one of torch.optim's own (a compare replays only those)")
    if cls_name not in PER_PARAMETER:
        raise NotReplayable(f"torch's {cls_name} does not step each parameter on its own (a compare replays "
                            f"{', '.join(sorted(PER_PARAMETER))})")
    return cls


def _number(v):
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    if isinstance(v, list):
        return [_number(x) for x in v]
    return v


def _replayable_class(desc: dict) -> type:
    """The class that replays the described step; NotReplayable says why none does."""
    if "not_replayable" in desc:
        raise NotReplayable(str(desc["not_replayable"]))
    return _torch_optimizer(desc["optimizer"])


def why_not(desc: dict) -> str | None:
    """Why this torch cannot replay the described step (its class, an option that is no plain value), or None."""
    try:
        _replayable_class(desc)
    except NotReplayable as exc:
        return str(exc)
    return None


def replay(desc: dict, tensors: list[torch.Tensor]) -> Iterator[torch.Tensor]:
    """The parameters after the described step (float64, CPU), from the tensors it started from, one
    at a time: each parameter's step depends only on its own gradient and state (``PER_PARAMETER``),
    so a compare holds one parameter's float64 copies at a time, whatever the model's size. Raises
    ``NotReplayable`` before the first when the step cannot be replayed."""
    cls = _replayable_class(desc)
    counts = _per_parameter(desc)
    if len(tensors) != sum(counts):
        raise NotReplayable(f"the inputs record holds {len(tensors)} tensors, its description {sum(counts)}")
    starts = list(itertools.accumulate(counts, initial=0))[:-1]  # each parameter's position among the tensors
    if any(not tensors[k].is_floating_point() for k in starts):
        raise NotReplayable("a parameter that is not floating point")
    return _replayed(cls, desc, iter(tensors))


def _replayed(cls: type, desc: dict, it: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
    entries = iter(desc["params"])
    for g in desc["groups"]:
        hyper = {k: _number(v) for k, v in g["hyper"].items()}
        for flag in IMPLEMENTATION_FLAGS:
            if flag in hyper:
                hyper[flag] = False
        for _ in range(g["n_params"]):
            entry = next(entries)
            p = next(it).detach().to("cpu", torch.float64).clone()
            if entry["grad"]:
                p.grad = next(it).detach().to("cpu", torch.float64).clone()
            state = {}
            for key, v in entry["state"].items():
                if v == "tensor":
                    t = next(it).detach().to("cpu")
                    # the step count keeps its dtype (torch's loop reads it as a number); the moments
                    # take the parameter's
                    state[key] = t.clone() if key == "step" or not t.is_floating_point() else t.to(torch.float64)
                else:
                    state[key] = _number(v["value"])
            try:
                opt = cls([{"params": [p], **hyper}])
                if state:
                    opt.state[p] = state
                opt.step()
            except (TypeError, ValueError, RuntimeError, KeyError, IndexError, AssertionError) as exc:
                raise NotReplayable(f"torch's {cls.__name__} refused the captured step: {exc}") from exc
            yield p.detach()


def option_differences(desc_a: dict, desc_b: dict) -> list[str]:
    """How the runs' optimizers differ in what they compute: class, groups, and the options both
    runs' groups have (a torch release may add one), implementation flags aside."""
    if desc_a["optimizer"] != desc_b["optimizer"]:
        return [f"optimizer {desc_a['optimizer']} in A, {desc_b['optimizer']} in B"]
    ga, gb = desc_a["groups"], desc_b["groups"]
    if [g["n_params"] for g in ga] != [g["n_params"] for g in gb]:
        return [f"parameter groups of {[g['n_params'] for g in ga]} parameters in A, "
                f"{[g['n_params'] for g in gb]} in B"]
    out = []
    for n, (x, y) in enumerate(zip(ga, gb)):
        for key in sorted(set(x["hyper"]) & set(y["hyper"]) - set(IMPLEMENTATION_FLAGS)):
            if x["hyper"][key] != y["hyper"][key]:
                out.append(f"optimizer option {key}: {x['hyper'][key]!r} in A, {y['hyper'][key]!r} in B"
                           + (f" (group {n})" if len(ga) > 1 else ""))
    return out
