// A socket address for JavaScript: its text and port (tcp_listen.c: the client of an accepted
// connection, a listener's local end; tcp_relay.c: an upstream socket's local end, for the loop guard).
#ifndef KUP_SOCKADDR_JS_H
#define KUP_SOCKADDR_JS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <node_api.h>
#include <string.h>
#include <sys/socket.h>

// The dotted quad of an IPv4 address (network order) into `text`: what inet_ntop(AF_INET) writes, without
// the printf it formats each byte with (~0.3 % of the process's CPU under new connections, one a connection;
// inet_ntop(AF_INET6) of a v4-mapped address prints its last four bytes the same way).
static inline void ipv4_text(const struct in_addr* a, char text[INET_ADDRSTRLEN]) {
  const unsigned char* b = (const unsigned char*)&a->s_addr;
  char* p = text;
  for (int i = 0; i < 4; i++) {
    unsigned v = b[i];
    if (v >= 100) {
      *p++ = (char)('0' + v / 100);
      v %= 100;
      *p++ = (char)('0' + v / 10);
    } else if (v >= 10) {
      *p++ = (char)('0' + v / 10);
    }
    *p++ = (char)('0' + v % 10);
    *p++ = i < 3 ? '.' : '\0';
  }
}

// `text` gets the IPv4 or IPv6 address ("" for another family); returns the port (0 then).
static inline int sockaddr_text(const struct sockaddr_storage* addr, char text[INET6_ADDRSTRLEN]) {
  text[0] = '\0';
  if (addr->ss_family == AF_INET6) {
    const struct sockaddr_in6* a6 = (const struct sockaddr_in6*)addr;
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      // An IPv4 peer of a dual-stack socket (a service port listens on `::`): its IPv4 address, as the
      // relays name it (src/relay/address.ts's normalizeAddress), not `::ffff:a.b.c.d` to be cut again.
      struct in_addr v4;
      memcpy(&v4, &a6->sin6_addr.s6_addr[12], sizeof v4);
      ipv4_text(&v4, text);
    } else {
      inet_ntop(AF_INET6, &a6->sin6_addr, text, INET6_ADDRSTRLEN);
    }
    return ntohs(a6->sin6_port);
  }
  if (addr->ss_family == AF_INET) {
    const struct sockaddr_in* a4 = (const struct sockaddr_in*)addr;
    ipv4_text(&a4->sin_addr, text);
    return ntohs(a4->sin_port);
  }
  return 0;
}

// [address, port] of a descriptor's local end (getsockname), or undefined when it has none.
static inline napi_value local_name_js(napi_env env, int fd) {
  struct sockaddr_storage addr;
  socklen_t len = sizeof addr;
  napi_value out;
  if (fd < 0 || getsockname(fd, (struct sockaddr*)&addr, &len) != 0) {
    napi_get_undefined(env, &out);
    return out;
  }
  char text[INET6_ADDRSTRLEN];
  int port = sockaddr_text(&addr, text);
  napi_value address, portValue;
  napi_create_array_with_length(env, 2, &out);
  napi_create_string_latin1(env, text, NAPI_AUTO_LENGTH, &address);
  napi_create_int32(env, port, &portValue);
  napi_set_element(env, out, 0, address);
  napi_set_element(env, out, 1, portValue);
  return out;
}

#endif
