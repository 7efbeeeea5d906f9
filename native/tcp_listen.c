// tcp_listen: a service port's listening TCP socket, on Node's own event loop, without a net.Server
// (src/relay/tcp-accept.ts says when and why).
//
// listen() makes the socket as Node's server.listen() would (SO_REUSEADDR, SO_REUSEPORT when asked,
// IPV6_V6ONLY when asked, bind, listen with the caller's backlog) and adds it to one epoll set of the
// addon's own, which Node's loop watches as one descriptor (one uv_poll for every listener, as
// tcp_relay.c's set for relays): a listener is a descriptor and a slot here, no handle of its own
// (a uv_poll_t, an external and two Node-API references each cost ~0.55 KiB a listener outside the
// heap). TCP_NODELAY is set on it, so every accepted socket has it from accept4() on (Linux copies it).
// Each wake accepts up to ACCEPT_BATCH connections a listener with accept4(), which gives the peer's
// address too (no getpeername), and calls JavaScript once per connection: onAccept(id, fd, address,
// port); the descriptor is then JavaScript's. A wake's calls share one callback scope (batch_scope.h).
// Running out of descriptors (EMFILE, ENFILE) is told once per wake, onError(id, -errno), and what waits
// in the queue is shed as libuv does (its reserve-descriptor trick: closes a spare, accepts and closes,
// reopens it), so the socket does not stay readable. close() takes it out and closes it at once.
//
// Node-API for everything JavaScript sees; libuv (uv.h from the same headers) only for the loop.
#define _GNU_SOURCE  // accept4
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <node_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "batch_scope.h"
#include "epoll_set.h"
#include "sockaddr_js.h"

// Connections accepted per wake at most, so that one busy port does not hold the loop.
#define ACCEPT_BATCH 128
// Listeners whose events one wake takes at most (libuv comes back while the set stays readable).
#define EVENT_BATCH 128

// A listener's slot; its index is the listener's id for JavaScript while it listens.
typedef struct {
  int fd;             // -1: free
  uint32_t gen;       // bumped at each close: a later event of the slot's former listener is dropped
  int32_t nextFree;   // free slots are chained
} listener_t;

static napi_env g_env;
static napi_ref g_on_accept;
static napi_ref g_on_error;
static napi_ref g_batch_resource;  // the callback scopes' resource (one object for every listener)
static napi_async_context g_async;
static uv_loop_t* g_loop;
static int g_reserve = -1;  // a spare descriptor, given up to shed connections when none is left
static int g_epfd = -1;     // the listeners' epoll set
static uv_poll_t g_epoll;   // Node's loop watching it; holds the loop while listeners are open, as their polls did
static listener_t* g_slots;
static int32_t g_slot_count;
static int32_t g_free_head = -1;
static int32_t g_open;

static int32_t slot_take(int fd) {
  if (g_free_head < 0) {
    int32_t n = g_slot_count == 0 ? 64 : g_slot_count * 2;
    listener_t* slots = realloc(g_slots, sizeof *slots * (size_t)n);
    if (slots == NULL) return -1;
    g_slots = slots;
    for (int32_t i = n - 1; i >= g_slot_count; i--) {
      g_slots[i].fd = -1;
      g_slots[i].gen = 0;
      g_slots[i].nextFree = g_free_head;
      g_free_head = i;
    }
    g_slot_count = n;
  }
  int32_t s = g_free_head;
  g_free_head = g_slots[s].nextFree;
  g_slots[s].fd = fd;
  if (g_open++ == 0) uv_ref((uv_handle_t*)&g_epoll);
  return s;
}

static void slot_free(int32_t s) {
  g_slots[s].fd = -1;
  g_slots[s].gen++;
  g_slots[s].nextFree = g_free_head;
  g_free_head = s;
  if (--g_open == 0) uv_unref((uv_handle_t*)&g_epoll);
}

// The open listener `s` of generation `gen` (gen < 0: any): its descriptor, or -1.
static int slot_fd(int64_t s, int64_t gen) {
  if (s < 0 || s >= g_slot_count || g_slots[s].fd < 0) return -1;
  if (gen >= 0 && g_slots[s].gen != (uint32_t)gen) return -1;
  return g_slots[s].fd;
}

// Calls `fn_ref` with argv in the wake's callback scope (batch_scope.h). A throw is the process's
// uncaught exception.
static void call(napi_ref fn_ref, size_t argc, napi_value* argv) {
  napi_env env = g_env;
  napi_value fn, recv, result;
  napi_get_reference_value(env, fn_ref, &fn);
  napi_get_undefined(env, &recv);
  if (napi_call_function(env, recv, fn, argc, argv, &result) == napi_pending_exception) {
    napi_value err;
    napi_get_and_clear_last_exception(env, &err);
    napi_fatal_exception(env, err);
  }
}

static void notify_accept(int32_t s, batch_scope_t* w, int fd, const struct sockaddr_storage* addr) {
  char text[INET6_ADDRSTRLEN];
  int port = sockaddr_text(addr, text);
  napi_env env = g_env;
  batch_scope_open(env, w, g_batch_resource, g_async);
  napi_handle_scope scope;
  napi_open_handle_scope(env, &scope);
  napi_value argv[4];
  napi_create_int32(env, s, &argv[0]);
  napi_create_int32(env, fd, &argv[1]);
  napi_create_string_latin1(env, text, NAPI_AUTO_LENGTH, &argv[2]);
  napi_create_int32(env, port, &argv[3]);
  call(g_on_accept, 4, argv);
  napi_close_handle_scope(env, scope);
}

static void notify_error(int32_t s, batch_scope_t* w, int err) {
  napi_env env = g_env;
  batch_scope_open(env, w, g_batch_resource, g_async);
  napi_handle_scope scope;
  napi_open_handle_scope(env, &scope);
  napi_value argv[2];
  napi_create_int32(env, s, &argv[0]);
  napi_create_int32(env, -err, &argv[1]);
  call(g_on_error, 2, argv);
  napi_close_handle_scope(env, scope);
}

// No descriptor for the next connection: the spare one makes room to accept and close what waits.
static void shed(int lfd) {
  if (g_reserve < 0) return;
  close(g_reserve);
  g_reserve = -1;
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) break;
    close(fd);
  }
  g_reserve = open("/", O_RDONLY | O_CLOEXEC);
}

// One listener's wake: up to ACCEPT_BATCH connections, while JavaScript keeps it open.
static void accept_batch(int32_t s, uint32_t gen, batch_scope_t* wake) {
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    // Looked up again each time: JavaScript may close it (or open others, moving the slots) in a call.
    int lfd = slot_fd(s, gen);
    if (lfd < 0) break;
    struct sockaddr_storage addr;
    socklen_t len = sizeof addr;
    int fd = accept4(lfd, (struct sockaddr*)&addr, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      if (err == EMFILE || err == ENFILE) shed(lfd);
      notify_error(s, wake, err);
      break;
    }
    notify_accept(s, wake, fd, &addr);
  }
}

// The epoll set is readable: every listener with connections waiting, at most EVENT_BATCH a wake.
static void on_epoll(uv_poll_t* handle, int status, int events) {
  (void)handle;
  (void)events;
  if (status < 0) return;
  struct epoll_event batch[EVENT_BATCH];
  int n;
  do n = epoll_wait(g_epfd, batch, EVENT_BATCH, 0);
  while (n < 0 && errno == EINTR);
  batch_scope_t wake = {NULL, NULL};
  for (int i = 0; i < n; i++) {
    int32_t s = (int32_t)(batch[i].data.u64 & 0xffffffffu);
    uint32_t gen = (uint32_t)(batch[i].data.u64 >> 32);
    // As libuv's uv_poll on an error: the listener is no longer watched, and JavaScript is not told.
    if ((batch[i].events & EPOLLERR) != 0) {
      int lfd = slot_fd(s, gen);
      if (lfd >= 0) epoll_ctl(g_epfd, EPOLL_CTL_DEL, lfd, NULL);
      continue;
    }
    accept_batch(s, gen, &wake);
  }
  batch_scope_close(g_env, &wake);
}

static int32_t int_arg(napi_env env, napi_value v) {
  int32_t out = -1;
  napi_get_value_int32(env, v, &out);
  return out;
}

static napi_value int_result(napi_env env, int32_t value) {
  napi_value out;
  napi_create_int32(env, value, &out);
  return out;
}

// The descriptor of the open listener whose id is `v`, or -1.
static int listener_fd(napi_env env, napi_value v) {
  int64_t id = -1;
  if (napi_get_value_int64(env, v, &id) != napi_ok) return -1;
  return slot_fd(id, -1);
}

// setup(onAccept, onError): the callbacks of every listener; once per process (or again).
static napi_value Setup(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 2) return int_result(env, -EINVAL);
  napi_get_uv_event_loop(env, &g_loop);
  int err = epoll_set_open(g_loop, &g_epoll, on_epoll, &g_epfd);
  if (err != 0) return int_result(env, err);
  if (g_on_accept != NULL) napi_delete_reference(env, g_on_accept);
  if (g_on_error != NULL) napi_delete_reference(env, g_on_error);
  napi_create_reference(env, argv[0], 1, &g_on_accept);
  napi_create_reference(env, argv[1], 1, &g_on_error);
  if (g_async == NULL) {
    napi_value name, resource;
    napi_create_string_utf8(env, "kup.tcpListen", NAPI_AUTO_LENGTH, &name);
    napi_async_init(env, NULL, name, &g_async);
    napi_create_object(env, &resource);
    napi_create_reference(env, resource, 1, &g_batch_resource);
  }
  if (g_reserve < 0) g_reserve = open("/", O_RDONLY | O_CLOEXEC);
  g_env = env;
  return int_result(env, 0);
}

// listen(host, port, backlog, ipv6Only, reusePort): the listener's id (>= 0: the id of its accepts and
// errors, for port() and close(); another listener's once it is closed), or -errno (-EINVAL: the host is
// no IP address).
static napi_value Listen(napi_env env, napi_callback_info info) {
  size_t argc = 5;
  napi_value argv[5];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 5 || g_on_accept == NULL) return int_result(env, -EINVAL);
  char host[INET6_ADDRSTRLEN];
  size_t n = 0;
  if (napi_get_value_string_utf8(env, argv[0], host, sizeof host, &n) != napi_ok) return int_result(env, -EINVAL);
  int32_t port = int_arg(env, argv[1]);
  if (port < 0 || port > 65535) return int_result(env, -EINVAL);
  struct sockaddr_storage addr;
  socklen_t len;
  memset(&addr, 0, sizeof addr);
  struct sockaddr_in* a4 = (struct sockaddr_in*)&addr;
  struct sockaddr_in6* a6 = (struct sockaddr_in6*)&addr;
  if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)port);
    len = sizeof *a4;
  } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)port);
    len = sizeof *a6;
  } else
    return int_result(env, -EINVAL);
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return int_result(env, -errno);
  int one = 1;
  // As libuv's bind (SO_REUSEADDR always; IPV6_V6ONLY only when asked) and Node's reusePort.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int err = 0;
  if (int_arg(env, argv[4]) == 1 && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) err = errno;
  if (err == 0 && addr.ss_family == AF_INET6) {
    int v6only = int_arg(env, argv[3]) == 1;
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only) != 0) err = errno;
  }
  if (err == 0 && bind(fd, (struct sockaddr*)&addr, len) != 0) err = errno;
  if (err == 0 && listen(fd, int_arg(env, argv[2])) != 0) err = errno;
  int32_t s = err == 0 ? slot_take(fd) : -1;
  if (err == 0 && s < 0) err = ENOMEM;
  if (err == 0) {
    // epoll may refuse it (the per-user watch limit): an error as bind's, not a listener never woken.
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)g_slots[s].gen << 32 | (uint32_t)s};
    if (epoll_ctl(g_epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      err = errno;
      slot_free(s);
    }
  }
  if (err != 0) {
    close(fd);
    return int_result(env, -err);
  }
  return int_result(env, s);
}

// port(id): the port a listener is bound to (getsockname), or -errno.
static napi_value Port(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  int fd = argc < 1 ? -1 : listener_fd(env, argv[0]);
  if (fd < 0) return int_result(env, -EBADF);
  struct sockaddr_storage addr;
  socklen_t len = sizeof addr;
  if (getsockname(fd, (struct sockaddr*)&addr, &len) != 0) return int_result(env, -errno);
  in_port_t port = addr.ss_family == AF_INET6 ? ((struct sockaddr_in6*)&addr)->sin6_port
                                              : ((struct sockaddr_in*)&addr)->sin_port;
  return int_result(env, ntohs(port));
}

// close(id): stops accepting and closes the socket now (the port is free at once); 0 or -EBADF. The
// listener's events already taken by a wake are dropped (its slot's generation moved on).
static napi_value Close(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  int64_t id = -1;
  if (argc < 1 || napi_get_value_int64(env, argv[0], &id) != napi_ok || slot_fd(id, -1) < 0)
    return int_result(env, -EBADF);
  int fd = g_slots[id].fd;
  epoll_ctl(g_epfd, EPOLL_CTL_DEL, fd, NULL);
  close(fd);
  slot_free((int32_t)id);
  return int_result(env, 0);
}

// localName(fd): [address, port] of an accepted connection (where the client connected to), or undefined.
static napi_value LocalName(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  return local_name_js(env, argc < 1 ? -1 : int_arg(env, argv[0]));
}

// closeFd(fd, reset): closes an accepted connection JavaScript turned away (with RST when reset is 1).
static napi_value CloseFd(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  int fd = argc < 2 ? -1 : int_arg(env, argv[0]);
  if (fd < 0) return int_result(env, -EBADF);
  if (int_arg(env, argv[1]) == 1) {
    struct linger l = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  return int_result(env, close(fd) == 0 ? 0 : -errno);
}

static napi_value Init(napi_env env, napi_value exports) {
  napi_property_descriptor props[] = {
      {"setup", NULL, Setup, NULL, NULL, NULL, napi_enumerable, NULL},
      {"listen", NULL, Listen, NULL, NULL, NULL, napi_enumerable, NULL},
      {"port", NULL, Port, NULL, NULL, NULL, napi_enumerable, NULL},
      {"close", NULL, Close, NULL, NULL, NULL, napi_enumerable, NULL},
      {"localName", NULL, LocalName, NULL, NULL, NULL, napi_enumerable, NULL},
      {"closeFd", NULL, CloseFd, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  napi_define_properties(env, exports, sizeof props / sizeof props[0], props);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
