// udp_fast: the datagrams of established UDP sessions relayed without JavaScript (src/relay/udp-fast.ts
// says when a session is handed over and what JavaScript still sees).
//
// On Node's own event loop, no thread: a uv_poll on a dup() of the listener's descriptor (libuv keeps one
// watcher per descriptor number and dgram still sends the other sessions' replies on it) and on each
// handed-over session's own upstream descriptor (one descriptor a session, as the session caps count
// them: its dgram socket stops reading and no longer writes, so libuv has no watcher on it; the poll
// is closed before the socket). A listener's datagrams are read in recvmmsg
// batches: one from a known client goes out of its session's connected upstream socket at once; any other
// is handed to JavaScript (onMiss), which opens or feeds the session as it does without this addon. An
// upstream's replies are read in batches and sent back out of the listener in one sendmmsg, to the client's
// address. Each session counts its bytes and datagrams and keeps the time of its last datagram (ms, the
// realtime clock: Date.now), which JavaScript reads for expiry, caps and reporting. A receive or send
// error on an upstream (ICMP port unreachable: ECONNREFUSED) is handed to JavaScript (onError) with the
// session's id; the session is not used again until JavaScript removes it. A send that finds the socket
// buffer full drops the datagram, as the network may.
//
// The tap: a session whose observer still wants its datagrams (a tracer's sniffer) is relayed here all the
// same, with its tap on (tap()): each of its datagrams is sent on first, then handed to JavaScript, one
// call a batch for all the batch's tapped datagrams (the listener's onTap(count), given to open()), as
// entries of the Float64Array given to setupTap() (session id, side: 0 from the client / 1 to it, offset
// and length in the Buffer setupTap() returned, which is the memory the batches are read into: valid
// during the call only). The entries are handed over before any other call into JavaScript of the same
// batch (a new client's datagram, an upstream error), so the observer sees each session's datagrams in
// the order they came. JavaScript turns the tap off once the observer wants no more.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <node_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define BATCH 32
#define DGRAM_MAX 65536
// A listener's sessions by client address: a table of 16 chains at first, doubled while it holds more
// than two sessions a chain (a fixed 1,024 was 8 KiB for every listener that ever handed one over).
#define FIRST_BUCKETS 16

typedef struct listener listener_t;

typedef struct session {
  uv_poll_t poll;  // first: the poll's pointer is the session's
  listener_t* listener;
  struct session* next;  // bucket chain
  struct sockaddr_storage client;
  socklen_t client_len;
  uint32_t hash;
  int fd;  // the upstream socket's descriptor (dgram's: never closed here)
  int failed;
  int tap;  // its datagrams go to the listener's onTap too
  double id;
  double stats[5];  // last activity ms, bytes from client, bytes to client, datagrams from, datagrams to
} session_t;

struct listener {
  uv_poll_t poll;
  napi_env env;
  napi_ref on_miss;
  napi_ref on_error;
  napi_ref on_tap;  // NULL: its sessions cannot be tapped
  napi_async_context async;
  int fd;
  int family;
  int closing;
  double bypassed;  // datagrams relayed here, both ways
  session_t** buckets;  // NULL until the first session; a power of two of chains
  uint32_t nbuckets;
  uint32_t sessions;
};

// One loop thread: one set of batch buffers for every listener (pages untouched stay unmapped); once
// setupTap() made a Buffer of them, `buffers` is that Buffer's memory (the same array unless Node
// refuses external buffers).
static char static_buffers[BATCH][DGRAM_MAX];
static char (*buffers)[DGRAM_MAX] = static_buffers;
static napi_ref tap_buffer;
// The tapped datagrams of the batch being relayed: TAP_FIELDS numbers each, in setupTap()'s Float64Array.
#define TAP_FIELDS 4
static napi_ref tap_info_ref;
static double* tap_info;
static int tapped;
static struct mmsghdr msgs[BATCH];
static struct iovec iovs[BATCH];
static struct sockaddr_storage names[BATCH];

// Only ages are read from it (stats()): the monotonic clock, which no setting of the time moves.
static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1000.0 + (double)(ts.tv_nsec / 1000000);
}

static const uint8_t* addr_bytes(const struct sockaddr_storage* sa, size_t* len, uint16_t* port) {
  if (sa->ss_family == AF_INET) {
    const struct sockaddr_in* in = (const struct sockaddr_in*)sa;
    *len = 4;
    *port = in->sin_port;
    return (const uint8_t*)&in->sin_addr;
  }
  const struct sockaddr_in6* in6 = (const struct sockaddr_in6*)sa;
  *len = 16;
  *port = in6->sin6_port;
  return (const uint8_t*)&in6->sin6_addr;
}

static uint32_t hash_of(const struct sockaddr_storage* sa) {
  size_t len;
  uint16_t port;
  const uint8_t* b = addr_bytes(sa, &len, &port);
  uint32_t h = 2166136261u ^ port;
  for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 16777619u;
  return h;
}

static int same_client(const struct sockaddr_storage* a, const struct sockaddr_storage* b) {
  size_t la, lb;
  uint16_t pa, pb;
  const uint8_t* ba = addr_bytes(a, &la, &pa);
  const uint8_t* bb = addr_bytes(b, &lb, &pb);
  return a->ss_family == b->ss_family && pa == pb && memcmp(ba, bb, la) == 0;
}

static session_t* find(listener_t* l, const struct sockaddr_storage* sa) {
  if (l->buckets == NULL) return NULL;
  uint32_t h = hash_of(sa);
  for (session_t* s = l->buckets[h & (l->nbuckets - 1)]; s != NULL; s = s->next)
    if (s->hash == h && same_client(&s->client, sa)) return s;
  return NULL;
}

// Makes room for one more session: the first table, or one twice as large when the chains grow past
// two sessions each. 0, or -ENOMEM (the table stays as it was).
static int reserve(listener_t* l) {
  if (l->buckets != NULL && l->sessions < 2 * l->nbuckets) return 0;
  uint32_t n = l->buckets == NULL ? FIRST_BUCKETS : 2 * l->nbuckets;
  session_t** table = calloc(n, sizeof *table);
  if (table == NULL) return -ENOMEM;
  for (uint32_t i = 0; i < l->nbuckets; i++) {
    session_t* s = l->buckets[i];
    while (s != NULL) {
      session_t* next = s->next;
      s->next = table[s->hash & (n - 1)];
      table[s->hash & (n - 1)] = s;
      s = next;
    }
  }
  free(l->buckets);
  l->buckets = table;
  l->nbuckets = n;
  return 0;
}

static void prepare(int n) {
  for (int i = 0; i < n; i++) {
    iovs[i].iov_base = buffers[i];
    iovs[i].iov_len = DGRAM_MAX;
    memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
    msgs[i].msg_hdr.msg_iov = &iovs[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
    msgs[i].msg_hdr.msg_name = &names[i];
    msgs[i].msg_hdr.msg_namelen = sizeof names[i];
  }
}

// Calls a JavaScript callback as an event of the loop (microtasks run after it; a throw is uncaught).
static void call_js(listener_t* l, napi_ref ref, size_t argc, napi_value* argv) {
  napi_value fn, recv, result;
  napi_get_reference_value(l->env, ref, &fn);
  napi_get_global(l->env, &recv);  // make_callback wants an object
  if (napi_make_callback(l->env, l->async, recv, fn, argc, argv, &result) == napi_pending_exception) {
    napi_value err;
    napi_get_and_clear_last_exception(l->env, &err);
    napi_fatal_exception(l->env, err);
  }
}

// Notes datagram i of the batch (sent on already) for the tap.
static void tap_note(session_t* s, int side, int i, size_t len) {
  double* e = tap_info + TAP_FIELDS * tapped++;
  e[0] = s->id;
  e[1] = side;
  e[2] = (double)i * DGRAM_MAX;
  e[3] = (double)len;
}

// Hands the batch's tapped datagrams to JavaScript in one call (none when the listener is closing: its
// sessions were ended first).
static void tap_flush(listener_t* l) {
  int n = tapped;
  if (n == 0) return;
  tapped = 0;
  if (l->closing || l->on_tap == NULL) return;
  napi_handle_scope scope;
  napi_open_handle_scope(l->env, &scope);
  napi_value argv[1];
  napi_create_int32(l->env, n, &argv[0]);
  call_js(l, l->on_tap, 1, argv);
  napi_close_handle_scope(l->env, scope);
}

static void hand_over(listener_t* l, const char* data, size_t len, const struct sockaddr_storage* sa) {
  tap_flush(l);
  if (l->closing) return;  // JavaScript closed the listener from the tap: its callbacks are gone
  napi_handle_scope scope;
  napi_open_handle_scope(l->env, &scope);
  char text[INET6_ADDRSTRLEN + IF_NAMESIZE + 1];
  size_t alen;
  uint16_t port;
  const uint8_t* b = addr_bytes(sa, &alen, &port);
  inet_ntop(sa->ss_family, b, text, INET6_ADDRSTRLEN);
  // As Node names a link-local sender: with its interface (fe80::1%eth0).
  const struct sockaddr_in6* in6 = (const struct sockaddr_in6*)sa;
  if (sa->ss_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr) && in6->sin6_scope_id != 0) {
    size_t at = strlen(text);
    text[at] = '%';
    if (if_indextoname(in6->sin6_scope_id, text + at + 1) == NULL)
      snprintf(text + at + 1, IF_NAMESIZE, "%u", in6->sin6_scope_id);
  }
  napi_value argv[3];
  void* copy;
  napi_create_buffer_copy(l->env, len, data, &copy, &argv[0]);
  napi_create_string_latin1(l->env, text, NAPI_AUTO_LENGTH, &argv[1]);
  napi_create_uint32(l->env, ntohs(port), &argv[2]);
  call_js(l, l->on_miss, 3, argv);
  napi_close_handle_scope(l->env, scope);
}

static void fail_session(session_t* s, int err) {
  listener_t* l = s->listener;
  if (s->failed) return;
  s->failed = 1;
  uv_poll_stop(&s->poll);
  tap_flush(l);
  if (l->closing) return;  // as in hand_over
  napi_handle_scope scope;
  napi_open_handle_scope(l->env, &scope);
  napi_value argv[2];
  napi_create_double(l->env, s->id, &argv[0]);
  napi_create_int32(l->env, -err, &argv[1]);
  call_js(l, l->on_error, 2, argv);
  napi_close_handle_scope(l->env, scope);
}

static void on_listener(uv_poll_t* poll, int status, int events) {
  listener_t* l = (listener_t*)poll;
  (void)events;
  if (l->closing) return;
  if (status < 0) {
    // A pending socket error (EPOLLERR): libuv stopped the poll. Clear it and read on, or the service
    // socket would be read by no one.
    int err = 0;
    socklen_t err_len = sizeof err;
    getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &err_len);
    uv_poll_start(&l->poll, UV_READABLE, on_listener);
    return;
  }
  // One batch per wake-up: the loop's other handles get their turn (level-triggered, it comes back).
  prepare(BATCH);
  int n = recvmmsg(l->fd, msgs, BATCH, MSG_DONTWAIT, NULL);
  if (n <= 0) return;
  double now = now_ms();
  for (int i = 0; i < n && !l->closing; i++) {
    size_t len = msgs[i].msg_len;
    if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) continue;  // cannot be: buffers hold any datagram
    session_t* s = find(l, &names[i]);
    if (s == NULL || s->failed) {
      hand_over(l, buffers[i], len, &names[i]);
      continue;
    }
    s->stats[0] = now;
    s->stats[1] += (double)len;
    s->stats[3] += 1;
    l->bypassed += 1;
    int err = send(s->fd, buffers[i], len, MSG_DONTWAIT) < 0 ? errno : 0;
    if (s->tap) tap_note(s, 0, i, len);  // sent or not, as the JavaScript relay's observer saw it
    if (err != 0 && err != EAGAIN && err != EWOULDBLOCK && err != ENOBUFS) fail_session(s, err);
  }
  tap_flush(l);
}

static void on_upstream(uv_poll_t* poll, int status, int events) {
  session_t* s = (session_t*)poll;
  listener_t* l = s->listener;
  (void)events;
  if (s->failed || l->closing) return;
  if (status < 0) {
    // EPOLLERR: the ICMP error (port unreachable: ECONNREFUSED) is pending on the connected socket and
    // libuv stopped the poll. Handed to JavaScript now, as dgram's receive reports it.
    int err = 0;
    socklen_t err_len = sizeof err;
    if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0) err = errno;
    if (err != 0) {
      fail_session(s, err);
      return;
    }
    uv_poll_start(&s->poll, UV_READABLE, on_upstream);
    return;
  }
  prepare(BATCH);
  int n = recvmmsg(s->fd, msgs, BATCH, MSG_DONTWAIT, NULL);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) fail_session(s, errno);
    return;
  }
  if (n == 0) return;
  double now = now_ms();
  for (int i = 0; i < n; i++) {
    iovs[i].iov_len = msgs[i].msg_len;
    s->stats[2] += (double)msgs[i].msg_len;
    memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
    msgs[i].msg_hdr.msg_iov = &iovs[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
    msgs[i].msg_hdr.msg_name = &s->client;
    msgs[i].msg_hdr.msg_namelen = s->client_len;
  }
  s->stats[0] = now;
  s->stats[4] += n;
  l->bypassed += n;
  // Replies the listener's buffer cannot take are dropped, as a full buffer drops them.
  for (int sent = 0; sent < n;) {
    int m = sendmmsg(l->fd, msgs + sent, (unsigned)(n - sent), MSG_DONTWAIT);
    if (m <= 0) {
      if (m < 0 && errno == EINTR) continue;
      sent++;  // skip the one that failed
      continue;
    }
    sent += m;
  }
  if (s->tap) {
    for (int i = 0; i < n; i++) tap_note(s, 1, i, iovs[i].iov_len);
    tap_flush(l);
  }
}

static void free_listener(uv_handle_t* h) {
  free(((listener_t*)h)->buckets);
  free(h);
}

static void free_session(uv_handle_t* h) {
  free(h);
}

static listener_t* listener_arg(napi_env env, napi_value v) {
  void* p = NULL;
  if (napi_get_value_external(env, v, &p) != napi_ok) return NULL;
  return (listener_t*)p;
}

static napi_value int_result(napi_env env, int32_t value) {
  napi_value out;
  napi_create_int32(env, value, &out);
  return out;
}

// open(fd, onMiss, onError, onTap?): a listener's fast path from now on; its dgram socket must stop
// reading. onTap(count): its sessions' tapped datagrams (without it, none of them can be tapped).
// Returns the listener (an external) or -errno.
static napi_value Open(napi_env env, napi_callback_info info) {
  size_t argc = 4;
  napi_value argv[4];
  int32_t fd = -1;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 3 ||
      napi_get_value_int32(env, argv[0], &fd) != napi_ok || fd < 0)
    return int_result(env, -EBADF);
  struct sockaddr_storage own;
  socklen_t own_len = sizeof own;
  if (getsockname(fd, (struct sockaddr*)&own, &own_len) != 0) return int_result(env, -errno);
  uv_loop_t* loop;
  if (napi_get_uv_event_loop(env, &loop) != napi_ok) return int_result(env, -EINVAL);
  listener_t* l = calloc(1, sizeof *l);
  if (l == NULL) return int_result(env, -ENOMEM);
  l->env = env;
  l->family = own.ss_family;
  l->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (l->fd < 0) {
    int err = errno;
    free(l);
    return int_result(env, -err);
  }
  if (uv_poll_init_socket(loop, &l->poll, l->fd) != 0) {
    close(l->fd);
    free(l);
    return int_result(env, -EINVAL);
  }
  napi_create_reference(env, argv[1], 1, &l->on_miss);
  napi_create_reference(env, argv[2], 1, &l->on_error);
  napi_valuetype type = napi_undefined;
  if (argc >= 4) napi_typeof(env, argv[3], &type);
  if (type == napi_function) napi_create_reference(env, argv[3], 1, &l->on_tap);
  napi_value name;
  napi_create_string_utf8(env, "kup.udpFast", NAPI_AUTO_LENGTH, &name);
  napi_async_init(env, NULL, name, &l->async);
  uv_poll_start(&l->poll, UV_READABLE, on_listener);
  napi_value out;
  napi_create_external(env, l, NULL, NULL, &out);
  return out;
}

// add(listener, id, address, port, upstreamFd): the session of client address:port (as the listener's
// socket names it) is relayed here from now on; its dgram upstream socket must stop reading. Returns the
// session (an external) or -errno (an address this cannot hold: JavaScript keeps the session).
static napi_value Add(napi_env env, napi_callback_info info) {
  size_t argc = 5;
  napi_value argv[5];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 5) return int_result(env, -EINVAL);
  listener_t* l = listener_arg(env, argv[0]);
  double id;
  char text[INET6_ADDRSTRLEN + 1];
  size_t text_len = 0;
  uint32_t port;
  int32_t fd;
  if (l == NULL || l->closing || napi_get_value_double(env, argv[1], &id) != napi_ok ||
      napi_get_value_string_latin1(env, argv[2], text, sizeof text, &text_len) != napi_ok ||
      napi_get_value_uint32(env, argv[3], &port) != napi_ok || napi_get_value_int32(env, argv[4], &fd) != napi_ok ||
      fd < 0 || port > 65535)
    return int_result(env, -EINVAL);
  session_t* s = calloc(1, sizeof *s);
  if (s == NULL) return int_result(env, -ENOMEM);
  if (l->family == AF_INET) {
    struct sockaddr_in* in = (struct sockaddr_in*)&s->client;
    in->sin_family = AF_INET;
    in->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, text, &in->sin_addr) != 1) goto invalid;
    s->client_len = sizeof *in;
  } else {
    // A scoped address (fe80::1%eth0) does not parse: its session stays in JavaScript.
    struct sockaddr_in6* in6 = (struct sockaddr_in6*)&s->client;
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)port);
    if (inet_pton(AF_INET6, text, &in6->sin6_addr) != 1) goto invalid;
    s->client_len = sizeof *in6;
  }
  if (find(l, &s->client) != NULL) goto invalid;
  if (reserve(l) != 0) {
    free(s);
    return int_result(env, -ENOMEM);
  }
  uv_loop_t* loop;
  napi_get_uv_event_loop(env, &loop);
  s->fd = fd;
  // EEXIST while libuv still watches it (a send of dgram's waiting for room): it stays in JavaScript.
  if (uv_poll_init_socket(loop, &s->poll, s->fd) != 0) goto invalid;
  s->listener = l;
  s->id = id;
  s->hash = hash_of(&s->client);
  s->next = l->buckets[s->hash & (l->nbuckets - 1)];
  l->buckets[s->hash & (l->nbuckets - 1)] = s;
  l->sessions++;
  uv_poll_start(&s->poll, UV_READABLE, on_upstream);
  napi_value out;
  napi_create_external(env, s, NULL, NULL, &out);
  return out;
invalid:
  free(s);
  return int_result(env, -EINVAL);
}

static session_t* session_arg(napi_env env, napi_value v) {
  void* p = NULL;
  if (napi_get_value_external(env, v, &p) != napi_ok) return NULL;
  return (session_t*)p;
}

// stats(session, out): out[0..4] = ms since its last datagram here (Infinity before the first), bytes
// from the client, bytes to the client, datagrams from the client, datagrams to the client (what this
// relayed, nothing JavaScript did). An age, not a time: the caller's clock need not be this one.
static napi_value Stats(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 2) return int_result(env, -EINVAL);
  session_t* s = session_arg(env, argv[0]);
  napi_typedarray_type type;
  size_t length;
  void* data;
  if (s == NULL || napi_get_typedarray_info(env, argv[1], &type, &length, &data, NULL, NULL) != napi_ok ||
      type != napi_float64_array || length < 5)
    return int_result(env, -EINVAL);
  double* out = data;
  memcpy(out, s->stats, sizeof s->stats);
  out[0] = s->stats[3] + s->stats[4] == 0 ? (double)INFINITY : now_ms() - s->stats[0];
  return int_result(env, 0);
}

// remove(session): relayed here no more; its external must not be used again. Called before its dgram
// socket closes: the poll leaves the loop's epoll set now, the descriptor stays the socket's.
static napi_value Remove(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 1) return int_result(env, -EINVAL);
  session_t* s = session_arg(env, argv[0]);
  if (s == NULL) return int_result(env, -EINVAL);
  listener_t* l = s->listener;
  session_t** at = &l->buckets[s->hash & (l->nbuckets - 1)];
  while (*at != NULL && *at != s) at = &(*at)->next;
  if (*at == s) {
    *at = s->next;
    l->sessions--;
  }
  uv_close((uv_handle_t*)&s->poll, free_session);
  return int_result(env, 0);
}

// setupTap(info): info, a Float64Array of 4 × 32 numbers, is where each batch's tapped datagrams are
// described from now on; returns the Buffer whose bytes the entries' offsets point into, or -errno. Once
// per process (a second call keeps the Buffer and takes the new array).
static napi_value SetupTap(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_typedarray_type type;
  size_t length;
  void* data;
  napi_value ab;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 1 ||
      napi_get_typedarray_info(env, argv[0], &type, &length, &data, &ab, NULL) != napi_ok ||
      type != napi_float64_array || length < TAP_FIELDS * BATCH)
    return int_result(env, -EINVAL);
  napi_value buf;
  if (tap_buffer == NULL) {
    // The batches' own memory, or (where Node allows no external buffers) a Buffer they move to.
    if (napi_create_external_buffer(env, sizeof static_buffers, static_buffers, NULL, NULL, &buf) != napi_ok) {
      napi_value ignored;
      napi_get_and_clear_last_exception(env, &ignored);
      void* mem;
      if (napi_create_buffer(env, sizeof static_buffers, &mem, &buf) != napi_ok) return int_result(env, -ENOMEM);
      buffers = mem;
    }
    napi_create_reference(env, buf, 1, &tap_buffer);
  } else
    napi_get_reference_value(env, tap_buffer, &buf);
  if (tap_info_ref != NULL) napi_delete_reference(env, tap_info_ref);
  napi_create_reference(env, argv[0], 1, &tap_info_ref);
  tap_info = data;
  return buf;
}

// tap(session, on): its datagrams go to the listener's onTap too, or no more. 0, or -EINVAL (no
// setupTap(), or a listener opened without onTap).
static napi_value Tap(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  bool on = false;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 2) return int_result(env, -EINVAL);
  session_t* s = session_arg(env, argv[0]);
  if (s == NULL || napi_get_value_bool(env, argv[1], &on) != napi_ok) return int_result(env, -EINVAL);
  if (on && (tap_info == NULL || s->listener->on_tap == NULL)) return int_result(env, -EINVAL);
  s->tap = on;
  return int_result(env, 0);
}

// bypassed(listener): datagrams this relayed for the listener, both ways.
static napi_value Bypassed(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  listener_t* l = argc < 1 ? NULL : listener_arg(env, argv[0]);
  napi_value out;
  napi_create_double(env, l == NULL ? -1 : l->bypassed, &out);
  return out;
}

// close(listener): stops reading the listener (its sessions must all be removed first); the external
// must not be used again.
static napi_value Close(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  listener_t* l = argc < 1 ? NULL : listener_arg(env, argv[0]);
  if (l == NULL || l->closing) return int_result(env, -EINVAL);
  l->closing = 1;
  napi_delete_reference(env, l->on_miss);
  napi_delete_reference(env, l->on_error);
  if (l->on_tap != NULL) napi_delete_reference(env, l->on_tap);
  l->on_tap = NULL;
  napi_async_destroy(env, l->async);
  // uv_close takes the duplicate out of the loop's epoll set now; closed after it, since the dgram
  // socket keeps the file open (epoll would go on reporting a closed duplicate).
  uv_close((uv_handle_t*)&l->poll, free_listener);
  close(l->fd);
  return int_result(env, 0);
}

static napi_value Init(napi_env env, napi_value exports) {
  napi_property_descriptor props[] = {
      {"open", NULL, Open, NULL, NULL, NULL, napi_enumerable, NULL},
      {"add", NULL, Add, NULL, NULL, NULL, napi_enumerable, NULL},
      {"stats", NULL, Stats, NULL, NULL, NULL, napi_enumerable, NULL},
      {"remove", NULL, Remove, NULL, NULL, NULL, napi_enumerable, NULL},
      {"bypassed", NULL, Bypassed, NULL, NULL, NULL, napi_enumerable, NULL},
      {"setupTap", NULL, SetupTap, NULL, NULL, NULL, napi_enumerable, NULL},
      {"tap", NULL, Tap, NULL, NULL, NULL, napi_enumerable, NULL},
      {"close", NULL, Close, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  napi_define_properties(env, exports, sizeof props / sizeof props[0], props);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
