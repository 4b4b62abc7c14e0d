// The keys of one attempt of a run, in a rendezvous store that can outlive the attempt.
//
// torchrun's agent hosts the TCP store and keeps it when it restarts the ranks (--max-restarts),
// so a restarted rank finds the previous attempt's keys, Gloo's listening addresses among them.
// Reading a peer's address before the restarted peer has replaced it, it connects to a port that
// died with the old process ("Gloo connectFullMesh failed … Connection refused"). Every key an
// attempt writes therefore goes under a prefix that no earlier attempt used.
//
// TORCHELASTIC_RESTART_COUNT cannot be that prefix: each node's agent counts its own restarts,
// and an agent that restarts its ranks because another node's rank failed (a membership change)
// does not count it, so the ranks of one attempt can hold different counts (measured: two
// agents under --rdzv-backend c10d, counts 0 and 1). The ranks agree on the attempt instead:
// each writes a fresh random nonce to its rank's slot, and the attempt is named by a hash of all
// the slots. A rank that read a slot before its new owner wrote it computes a name nobody else
// will and waits in it until a slot changes; a name under which all ranks have counted
// themselves holds every rank's own nonce, so each of its slots belongs to this attempt.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <string>

namespace c10d {
class Store;
}

namespace kiln::dist {

// `store` seen through the prefix "kiln/<run_id>/attempt/<name>/" that the `world_size` ranks of
// this attempt agree on (every rank calls this once per attempt). Blocks until every rank has
// agreed; throws std::runtime_error when that takes longer than `timeout`.
c10::intrusive_ptr<c10d::Store> attempt_store(const c10::intrusive_ptr<c10d::Store>& store,
                                              const std::string& run_id, int rank, int world_size,
                                              std::chrono::milliseconds timeout);

}  // namespace kiln::dist
