#include "dist/listen_socket.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace kiln::dist {

bool is_loopback(const std::string& addr) {
  if (addr == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, addr.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, addr.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

int listen_on_loopback(const std::string& addr, int port) {
  if (!is_loopback(addr)) throw std::invalid_argument("'" + addr + "' is not a loopback address");
  if (port < 0 || port > 65535) {
    throw std::invalid_argument("port " + std::to_string(port) + " is out of range");
  }
  sockaddr_storage storage{};
  socklen_t length = 0;
  in6_addr v6{};
  if (inet_pton(AF_INET6, addr.c_str(), &v6) == 1) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&storage);
    a->sin6_family = AF_INET6;
    a->sin6_addr = v6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&storage);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    const std::string v4 = addr == "localhost" ? "127.0.0.1" : addr;
    inet_pton(AF_INET, v4.c_str(), &a->sin_addr);
    length = sizeof *a;
  }
  const auto fail = [&](const char* what, int fd) {
    const int error = errno;
    const std::string message = std::string("cannot listen on ") + addr + ":" +
                                std::to_string(port) + ": " + what + ": " + std::strerror(error);
    if (fd >= 0) close(fd);
    return std::runtime_error(message);
  };
  const int fd = socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw fail("socket", fd);
  const int on = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0) throw fail("setsockopt", fd);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&storage), length) != 0) throw fail("bind", fd);
  if (listen(fd, SOMAXCONN) != 0) throw fail("listen", fd);
  return fd;
}

}  // namespace kiln::dist
