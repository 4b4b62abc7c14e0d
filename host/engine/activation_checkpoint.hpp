// Activation checkpointing (memory.checkpoint): segments of a model's kiln::BlockChains keep only
// their input in forward and recompute the rest in backward, trading one extra forward of each
// segment for the memory of its activations.
//
// Exact: a recomputed segment sees the RNG state (CPU and its device's) and the autocast state of
// its first forward, so dropout masks and casts repeat; its buffers (batch-norm running
// statistics) are restored after the recomputation, so they move once per forward step as in an
// uncheckpointed run. Parameter gradients are returned from the segment's autograd node and
// accumulated by the outer autograd engine, so DDP's per-parameter hooks fire as usual.
//
// Limits: DDP's find_unused_parameters cannot see inside a checkpointed segment (the segment's
// parameters are inputs of one node, all reached or none), so the trainer refuses the two
// together. A synced norm layer inside a segment communicates again when recomputed.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "kiln/torch.hpp"

namespace kiln::engine {

// Splits chains of the given sizes into Chen et al.'s sqrt(n) schedule: runs of
// k = ceil(sqrt(n)) consecutive blocks, n the total over all chains; a segment never crosses a
// chain, so a chain of m blocks gets ceil(m / k) segments (none when m = 0).
std::vector<std::vector<kiln::BlockChain::Segment>> sqrt_segments(
    const std::vector<size_t>& chain_sizes);

// Installs checkpointing on `model`'s chains from memory.checkpoint's value `spec`:
//   {} or {"none"}  off (clears what an earlier call installed);
//   {"sqrt"}        sqrt_segments over the model's outermost chains;
//   names           each a chain block ("layers.3": that block alone is a segment) or a whole
//                   chain ("layer2": the chain is one segment).
// Throws PipelineError for "none"/"sqrt" mixed with other entries, a name that is no block or
// chain (with the nearest valid name and those available), a name given twice or inside a chain
// already named whole, and checkpointing asked of a model without chains. `model_name` (the
// model component's name) only appears in messages. Returns a one-line description of the
// segments for the log ("sqrt (n=9, k=3): layers 3 segments [0-2 3-5 6-8] of 9"), empty when off.
std::string apply_activation_checkpointing(kiln::Model& model, const std::vector<std::string>& spec,
                                           const std::string& model_name = "");

// The runner apply_activation_checkpointing installs: runs blocks [first, end) of `chain` on `x`,
// keeping only `x` for backward. Runs plainly when nothing needs a gradient (grad mode off, or
// neither `x` nor the segment's parameters require one).
at::Tensor run_checkpointed(kiln::BlockChain& chain, kiln::BlockChain::Segment segment,
                            const at::Tensor& x);

}  // namespace kiln::engine
