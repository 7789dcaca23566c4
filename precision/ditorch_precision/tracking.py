"""Where an op runs: module path (forward via module hooks, backward via autograd node tags),
training step (optimizer hooks) and rank."""
from __future__ import annotations

import os
import weakref

import torch
import torch.nn.modules.module as nn_module
import torch.optim.optimizer as optim_hooks
from torch.utils._pytree import tree_leaves

# Key under which the forward module path is stored in an autograd node's metadata.
NODE_KEY = "ditorch_precision.module"


class ModuleTracker:
    """Keeps the stack of running modules and tags the autograd nodes each module creates, so
    backward ops can be attributed to the module whose forward created them."""

    def __init__(self, on_output=None) -> None:
        self.on_output = on_output  # called as on_output(path, output) when a module returns
        self.stack: list[tuple[str, int]] = []  # (path, sequence number at the module's entry)
        self._names: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()
        self._roots: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
        self._handles: list = []
        self._seen: set[str] = set()  # every path named (kept after the modules are gone)
        # tags the autograd nodes a module created as (output, path, sequence number at its entry);
        # a capture's C++ observer keeps the tags itself (native_hook)
        self.tagger = self._tag
        # told of each module's entry (its path) and return, after the stack moved and the output
        # was handed on: a capture's C++ observer keeps its own stack (native_hook), without hooks
        # of its own on every module call
        self.on_enter = None
        self.on_exit = None
        # told of each root module the first time it runs, before its first op (its path)
        self.on_root = None
        # told of each return of a root module, with what it was called with (its path, args, kwargs)
        self.on_root_return = None

    def __enter__(self) -> "ModuleTracker":
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post, with_kwargs=True, always_call=True),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.stack.clear()

    def _path_of(self, module: torch.nn.Module) -> str:
        if not self.stack and module not in self._names:
            # A new root: name it and every submodule once, "<RootClass>.<attribute path>". A module named
            # already keeps its name when it runs with no module around it: a checkpointed block's
            # recompute in backward, a submodule called on its own.
            self._roots.add(module)
            root = type(module).__name__
            for name, sub in module.named_modules(remove_duplicate=False):
                self._names[sub] = f"{root}.{name}" if name else root
            self._seen.update(self._names[sub] for _, sub in module.named_modules(remove_duplicate=False))
            if self.on_root is not None:
                self.on_root(module, self._names[module])
        path = self._names.get(module)
        if path is None:
            parent = self.stack[-1][0] if self.stack else ""
            path = f"{parent}.{type(module).__name__}" if parent else type(module).__name__
            self._names[module] = path
            self._seen.add(path)
        return path

    def _pre(self, module: torch.nn.Module, args) -> None:
        path = self._path_of(module)
        self.stack.append((path, torch._C._autograd._get_sequence_nr()))
        if self.on_enter is not None:
            self.on_enter(path)

    def _post(self, module: torch.nn.Module, args, *rest) -> None:
        # (kwargs, output) on a return; when the module raised, torch calls an always-called global hook
        # with (args, None) and no kwargs. The module's entry is popped either way: non-reentrant
        # checkpointing stops a recompute by raising out of its innermost module, and an entry left on the
        # stack put every later op (the next step's included) inside that module.
        try:
            if not self.stack:
                return
            path, seq_start = self.stack.pop()
            if len(rest) != 2:
                return
            kwargs, output = rest
            if torch.is_grad_enabled():
                self.tagger(output, path, seq_start)
            if self.on_output is not None:
                self.on_output(path, output)
            if not self.stack and self.on_root_return is not None and module in self._roots:
                self.on_root_return(path, args, kwargs)
        finally:
            if self.on_exit is not None:
                self.on_exit()

    @staticmethod
    def _tag(output, path: str, seq_start: int) -> None:
        """Tag the nodes created since the module started (inner modules tagged theirs first)."""
        todo = [t.grad_fn for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        seen: set[int] = set()
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if node._sequence_nr() < seq_start:
                continue
            node.metadata.setdefault(NODE_KEY, path)
            todo.extend(fn for fn, _ in node.next_functions)

    def paths_seen(self) -> list[str]:
        """Every module path named so far (all submodules of each model that ran)."""
        return sorted(self._seen)

    def current(self) -> tuple[str | None, bool]:
        """(module path, inside a backward pass)."""
        in_backward = torch._C._current_graph_task_id() != -1
        if self.stack:
            return self.stack[-1][0], in_backward
        if in_backward:
            node = torch._C._current_autograd_node()
            if node is not None:
                return node.metadata.get(NODE_KEY), True
        return None, in_backward


class StepTracker:
    """Counts optimizer steps (any optimizer) and marks the ops an optimizer step runs."""

    def __init__(self, start: int = 0, on_step=None, on_optimizer=None, on_optimizer_start=None) -> None:
        self.step = start
        self.in_optimizer = False
        self.on_step = on_step  # called after each optimizer step
        self.on_optimizer = on_optimizer  # called with the optimizer as its step ends, before the count advances
        self.on_optimizer_start = on_optimizer_start  # called with the optimizer before its step runs
        self._handles: list = []

    def __enter__(self) -> "StepTracker":
        self._handles = [
            optim_hooks.register_optimizer_step_pre_hook(self._pre),
            optim_hooks.register_optimizer_step_post_hook(self._post),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _pre(self, optimizer, args, kwargs) -> None:
        if self.on_optimizer_start is not None:
            self.on_optimizer_start(optimizer)
        self.in_optimizer = True

    def _post(self, optimizer, args, kwargs) -> None:
        self.in_optimizer = False
        if self.on_optimizer is not None:
            self.on_optimizer(optimizer)
        self.step += 1
        if self.on_step is not None:
            self.on_step()


class RankInfo:
    """The process's rank: torch.distributed once initialised, else $RANK (read once), else 0."""

    def __init__(self) -> None:
        self._rank: int | None = None
        self._env_rank: int | None = None

    def get(self) -> int:
        if self._rank is not None:
            return self._rank
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            self._rank = dist.get_rank()
            return self._rank
        if self._env_rank is None:
            self._env_rank = int(os.environ.get("RANK", "0") or 0)
        return self._env_rank
