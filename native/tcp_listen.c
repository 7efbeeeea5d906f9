// tcp_listen: a service port's listening TCP socket, on Node's own event loop, without a net.Server
// (src/relay/tcp-accept.ts says when and why).
//
// listen() makes the socket as Node's server.listen() would (SO_REUSEADDR, SO_REUSEPORT when asked,
// IPV6_V6ONLY when asked, bind, listen with the caller's backlog) and watches it with uv_poll; TCP_NODELAY
// is set on it, so every accepted socket has it from accept4() on (Linux copies it). Each wake accepts up
// to ACCEPT_BATCH connections with accept4(), which gives the peer's address too (no getpeername), and
// calls JavaScript once per connection: onAccept(owner, fd, address, port); the descriptor is then
// JavaScript's. A wake's calls share one callback scope (batch_scope.h). Running out of descriptors
// (EMFILE, ENFILE) is told once per wake, onError(owner, -errno), and what waits in the queue is shed as
// libuv does (its reserve-descriptor trick: closes a spare, accepts and closes, reopens it), so the
// socket does not stay readable. close() stops and closes it at once.
//
// Node-API for everything JavaScript sees; libuv (uv.h from the same headers) only for the loop.
#define _GNU_SOURCE  // accept4
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <node_api.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "batch_scope.h"
#include "sockaddr_js.h"

// Connections accepted per wake at most, so that one busy port does not hold the loop.
#define ACCEPT_BATCH 128

typedef struct {
  uv_poll_t poll;
  int fd;
  int closed;         // close() called: it accepts no more
  int handleClosed;   // its poll's close callback ran
  int collected;      // its external was collected
  napi_ref owner;
} listener_t;

static napi_env g_env;
static napi_ref g_on_accept;
static napi_ref g_on_error;
static napi_async_context g_async;
static uv_loop_t* g_loop;
static int g_reserve = -1;  // a spare descriptor, given up to shed connections when none is left

// Calls `fn_ref` with argv (argv[0], the owner, is `this`) in the wake's callback scope (batch_scope.h). A
// throw is the process's uncaught exception.
static void call(napi_ref fn_ref, size_t argc, napi_value* argv) {
  napi_env env = g_env;
  napi_value fn, result;
  napi_get_reference_value(env, fn_ref, &fn);
  if (napi_call_function(env, argv[0], fn, argc, argv, &result) == napi_pending_exception) {
    napi_value err;
    napi_get_and_clear_last_exception(env, &err);
    napi_fatal_exception(env, err);
  }
}


static void notify_accept(listener_t* l, batch_scope_t* w, int fd, const struct sockaddr_storage* addr) {
  char text[INET6_ADDRSTRLEN];
  int port = sockaddr_text(addr, text);
  napi_env env = g_env;
  batch_scope_open(env, w, l->owner, g_async);
  napi_handle_scope scope;
  napi_open_handle_scope(env, &scope);
  napi_value argv[4];
  napi_get_reference_value(env, l->owner, &argv[0]);
  napi_create_int32(env, fd, &argv[1]);
  napi_create_string_latin1(env, text, NAPI_AUTO_LENGTH, &argv[2]);
  napi_create_int32(env, port, &argv[3]);
  call(g_on_accept, 4, argv);
  napi_close_handle_scope(env, scope);
}

static void notify_error(listener_t* l, batch_scope_t* w, int err) {
  napi_env env = g_env;
  batch_scope_open(env, w, l->owner, g_async);
  napi_handle_scope scope;
  napi_open_handle_scope(env, &scope);
  napi_value argv[2];
  napi_get_reference_value(env, l->owner, &argv[0]);
  napi_create_int32(env, -err, &argv[1]);
  call(g_on_error, 2, argv);
  napi_close_handle_scope(env, scope);
}

// No descriptor for the next connection: the spare one makes room to accept and close what waits.
static void shed(listener_t* l) {
  if (g_reserve < 0) return;
  close(g_reserve);
  g_reserve = -1;
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) break;
    close(fd);
  }
  g_reserve = open("/", O_RDONLY | O_CLOEXEC);
}

static void on_poll(uv_poll_t* handle, int status, int events) {
  listener_t* l = (listener_t*)handle;
  (void)events;
  if (status < 0) return;
  batch_scope_t wake = {NULL, NULL};
  for (int i = 0; i < ACCEPT_BATCH && !l->closed; i++) {
    struct sockaddr_storage addr;
    socklen_t len = sizeof addr;
    int fd = accept4(l->fd, (struct sockaddr*)&addr, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      if (err == EMFILE || err == ENFILE) shed(l);
      notify_error(l, &wake, err);
      break;
    }
    notify_accept(l, &wake, fd, &addr);
  }
  batch_scope_close(g_env, &wake);
}

// Freed once both its poll is closed and its external is gone.
static void on_closed(uv_handle_t* handle) {
  listener_t* l = (listener_t*)handle;
  l->handleClosed = 1;
  if (l->collected) free(l);
}

static void on_collected(napi_env env, void* data, void* hint) {
  (void)env;
  (void)hint;
  listener_t* l = data;
  l->collected = 1;
  if (l->handleClosed) free(l);
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

// The listener behind an external from listen(); NULL when it is none or closed.
static listener_t* listener_of(napi_env env, napi_value v) {
  void* data = NULL;
  if (napi_get_value_external(env, v, &data) != napi_ok) return NULL;
  listener_t* l = data;
  return l == NULL || l->closed ? NULL : l;
}

// setup(onAccept, onError): the callbacks of every listener; once per process (or again).
static napi_value Setup(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 2) return int_result(env, -EINVAL);
  if (g_on_accept != NULL) napi_delete_reference(env, g_on_accept);
  if (g_on_error != NULL) napi_delete_reference(env, g_on_error);
  napi_create_reference(env, argv[0], 1, &g_on_accept);
  napi_create_reference(env, argv[1], 1, &g_on_error);
  if (g_async == NULL) {
    napi_value name;
    napi_create_string_utf8(env, "kup.tcpListen", NAPI_AUTO_LENGTH, &name);
    napi_async_init(env, NULL, name, &g_async);
  }
  if (g_reserve < 0) g_reserve = open("/", O_RDONLY | O_CLOEXEC);
  g_env = env;
  napi_get_uv_event_loop(env, &g_loop);
  return int_result(env, 0);
}

// listen(owner, host, port, backlog, ipv6Only, reusePort): an external (the listener), or -errno
// (-EINVAL: the host is no IP address).
static napi_value Listen(napi_env env, napi_callback_info info) {
  size_t argc = 6;
  napi_value argv[6];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 6 || g_on_accept == NULL) return int_result(env, -EINVAL);
  char host[INET6_ADDRSTRLEN];
  size_t n = 0;
  if (napi_get_value_string_utf8(env, argv[1], host, sizeof host, &n) != napi_ok) return int_result(env, -EINVAL);
  int32_t port = int_arg(env, argv[2]);
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
  if (int_arg(env, argv[5]) == 1 && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) err = errno;
  if (err == 0 && addr.ss_family == AF_INET6) {
    int v6only = int_arg(env, argv[4]) == 1;
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only) != 0) err = errno;
  }
  if (err == 0 && bind(fd, (struct sockaddr*)&addr, len) != 0) err = errno;
  if (err == 0 && listen(fd, int_arg(env, argv[3])) != 0) err = errno;
  listener_t* l = err == 0 ? calloc(1, sizeof *l) : NULL;
  if (l == NULL) {
    close(fd);
    return int_result(env, -(err != 0 ? err : ENOMEM));
  }
  l->fd = fd;
  // epoll may refuse it (the per-user watch limit): an error as bind's, not a poll that was never made.
  err = uv_poll_init_socket(g_loop, &l->poll, fd);
  if (err != 0) {
    free(l);
    close(fd);
    return int_result(env, err);
  }
  napi_create_reference(env, argv[0], 1, &l->owner);
  uv_poll_start(&l->poll, UV_READABLE, on_poll);
  napi_value out;
  napi_create_external(env, l, on_collected, NULL, &out);
  return out;
}

// port(listener): the port it is bound to (getsockname), or -errno.
static napi_value Port(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  listener_t* l = argc < 1 ? NULL : listener_of(env, argv[0]);
  if (l == NULL) return int_result(env, -EBADF);
  struct sockaddr_storage addr;
  socklen_t len = sizeof addr;
  if (getsockname(l->fd, (struct sockaddr*)&addr, &len) != 0) return int_result(env, -errno);
  in_port_t port = addr.ss_family == AF_INET6 ? ((struct sockaddr_in6*)&addr)->sin6_port
                                              : ((struct sockaddr_in*)&addr)->sin_port;
  return int_result(env, ntohs(port));
}

// close(listener): stops accepting and closes the socket now (the port is free at once); 0 or -EBADF.
static napi_value Close(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  listener_t* l = argc < 1 ? NULL : listener_of(env, argv[0]);
  if (l == NULL) return int_result(env, -EBADF);
  l->closed = 1;
  uv_close((uv_handle_t*)&l->poll, on_closed);
  close(l->fd);
  napi_delete_reference(env, l->owner);
  l->owner = NULL;
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
