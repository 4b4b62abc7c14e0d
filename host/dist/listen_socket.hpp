// Listening sockets on loopback for the rendezvous store. c10d's TCPStore has no option for the
// address it listens on (it takes every interface) but adopts a socket that is already bound
// (TCPStoreOptions::masterListenFd): a run whose ranks all meet on loopback keeps its
// unauthenticated store there. Torch-free.
#pragma once

#include <string>

namespace kiln::dist {

// Whether `addr` names this host's loopback: "localhost", an IPv4 address in 127.0.0.0/8 or ::1.
bool is_loopback(const std::string& addr);

// A TCP socket listening at `addr`:`port`, where `addr` is a loopback address as is_loopback
// accepts ("localhost" listens on 127.0.0.1). SO_REUSEADDR and close-on-exec are set, so a
// restarted group can take the port again at once and no child inherits it. The caller owns the
// descriptor. Throws std::invalid_argument when `addr` is not loopback and std::runtime_error,
// naming address and port, when the socket cannot be bound.
int listen_on_loopback(const std::string& addr, int port);

}  // namespace kiln::dist
