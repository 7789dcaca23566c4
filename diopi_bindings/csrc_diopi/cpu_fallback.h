// The boxed fallback of the diopi device: every operator without a kernel of its own on PrivateUse1 (no route of
// the table, no composite, no kernel the device's Python set-up registered for its own-ABI library) runs here,
// in C++. A view only changes metadata; anything else runs on the CPU: device inputs copied to the host, the
// operator's CPU kernel, written arguments copied back (resized if the operator resized them), results moved to
// the device. Random operators draw from the device's generator, which advances.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace diopi_bindings {

// Runs `op` on the CPU (or as a view). `count` names the call in fallback_counts(); the routes' declined calls
// (counted by the route) pass false.
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool count);

// Registers cpu_fallback as PrivateUse1's boxed fallback; once per process. `first_fallback` is called with an
// overload's name the first time it falls back (the log line), never again for it.
void register_fallback(std::function<void(const std::string&)> first_fallback);

// An argument as the meta kernel takes it: tensors (and lists of them) on the meta device, a device the meta one.
c10::IValue to_meta(const c10::IValue& v);

// The random operators without a generator argument that run with the device generator explicit.
std::vector<std::string> draw_explicitly();

std::vector<std::pair<std::string, int64_t>> fallback_counts();   // overload -> calls run on the CPU
std::vector<std::pair<std::string, int64_t>> fallback_copies();   // reason -> tensor copies

}  // namespace diopi_bindings
