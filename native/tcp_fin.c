// tcp_fin: the few socket calls Node has no JavaScript for, so that a relay can send its FIN in the same
// segment as the last data it passes on (src/relay/tcp-fin.ts says why and when).
//
// Node-API only (no V8 or libuv headers): one binary works on every Node version the package supports.
// Every function takes a file descriptor libuv owns; none blocks, none closes it, none changes what libuv
// knows of it. Errors come back as an errno, never as an exception.
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <node_api.h>
#include <sys/socket.h>

static int32_t fd_arg(napi_env env, napi_callback_info info, int32_t* second) {
  size_t argc = 2;
  napi_value argv[2];
  int32_t fd = -1;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 1) return -1;
  if (napi_get_value_int32(env, argv[0], &fd) != napi_ok) return -1;
  if (second != NULL && (argc < 2 || napi_get_value_int32(env, argv[1], second) != napi_ok)) return -1;
  return fd;
}

static napi_value int_result(napi_env env, int32_t value) {
  napi_value out;
  napi_create_int32(env, value, &out);
  return out;
}

// peekEnd(fd): 1 when the next read returns end of stream (the peer's FIN is queued and no byte is before
// it), 0 when bytes are waiting or nothing has come, -errno on an error (a reset, a bad fd). A pending
// socket error (ECONNRESET) is taken by the peek, as by a read: the caller is the only one to hear of it.
static napi_value PeekEnd(napi_env env, napi_callback_info info) {
  int32_t fd = fd_arg(env, info, NULL);
  if (fd < 0) return int_result(env, -EBADF);
  char byte;
  ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return int_result(env, 1);
  if (n > 0 || errno == EAGAIN || errno == EWOULDBLOCK) return int_result(env, 0);
  return int_result(env, -errno);
}

// shutdownWrite(fd): shutdown(SHUT_WR) now (libuv would wait for the end of the loop's poll batch); 0 or
// -errno.
static napi_value ShutdownWrite(napi_env env, napi_callback_info info) {
  int32_t fd = fd_arg(env, info, NULL);
  if (fd < 0) return int_result(env, -EBADF);
  return int_result(env, shutdown(fd, SHUT_WR) == 0 ? 0 : -errno);
}

// setCork(fd, on): TCP_CORK, so that a write and the FIN after it leave as one segment; 0 or -errno.
static napi_value SetCork(napi_env env, napi_callback_info info) {
  int32_t on = 0;
  int32_t fd = fd_arg(env, info, &on);
  if (fd < 0) return int_result(env, -EBADF);
  int value = on != 0;
  return int_result(env, setsockopt(fd, IPPROTO_TCP, TCP_CORK, &value, sizeof value) == 0 ? 0 : -errno);
}

static napi_value Init(napi_env env, napi_value exports) {
  napi_property_descriptor props[] = {
      {"peekEnd", NULL, PeekEnd, NULL, NULL, NULL, napi_enumerable, NULL},
      {"shutdownWrite", NULL, ShutdownWrite, NULL, NULL, NULL, napi_enumerable, NULL},
      {"setCork", NULL, SetCork, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  napi_define_properties(env, exports, sizeof props / sizeof props[0], props);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
