// tcp_relay: the byte relay of an established TCP connection, on Node's own event loop, once JavaScript
// has nothing more to do with its bytes (src/relay/tcp-offload.ts says when and why).
//
// start() dup()s both descriptors (Node then closes its sockets: a close() of one of two descriptors
// sends nothing) and watches the dups in an epoll set of the addon's own, which Node's loop watches as
// one descriptor (one uv_poll for every relay): a descriptor is added once, edge-triggered, and closing
// it takes it out (watch()), where a uv_poll per side cost ~10 epoll_ctl a connection (uv_poll_init_socket's
// ADD and DEL to check it, and a DEL and an ADD for each change of events).
// Each readable side is read into one buffer shared by every relay (the loop is single-threaded) and written on at once; what the other side's kernel does not
// take waits in a buffer of the connection's own, and the side that sent it is not read until it is out
// (backpressure). An end of stream is passed on with shutdown(SHUT_WR) once the bytes before it are out,
// in the same segment as the last of them (MSG_MORE) when they leave together; a reset or an error
// closes both sides, as the JavaScript relay's destroy() does. The idle, half-close and stall timeouts
// run on one timer per connection. JavaScript hears of a connection once, when it is over: the callback
// given to setup() gets (slot, reason, bytes from the client, bytes to the client); abort() ends one
// without the callback. A relay is its slot for JavaScript, which keeps each slot's owner (a Node-API
// reference a relay cost a global handle and a heap allocation made and freed per connection, and one
// lookup per callback); a slot freed during an epoll batch is reused only after it, so that what the
// batch queued for JavaScript (below) names the relay it was queued for.
//
// The tap: a traced connection is dialled (or handed over at connect) while its sniffer still wants bytes.
// While a side's tap is on (dial()'s `tap`, tap()), each chunk read from it is first written on (the write
// never waits for JavaScript; with the FIN too when it is the last) and then handed to the callback given
// to setupTap(), with the other chunks of the batch (tap_flush): the bytes are in the Buffer setupTap()
// returned, valid only during the call (src/trace/sniff/types.ts: a sniffer keeps no chunk). For each it
// says whether the connection still wants bytes; once it says no, both taps are off for good. A relay
// dialled with the tap has its connect and its end told in the same call, in their order.
//
// Node-API for everything JavaScript sees; libuv (uv.h from the same headers) only for the loop.
#define _GNU_SOURCE  // dup3
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

// Close reasons, as the numbers src/relay/tcp-offload.ts maps back to names.
enum {
  R_NONE = 0,
  R_CLIENT_FIN = 1,
  R_ENDPOINT_FIN = 2,
  R_CLIENT_RESET = 3,
  R_ENDPOINT_RESET = 4,
  R_ERROR = 5,
  R_IDLE = 6,
  R_HALF_CLOSE = 7,
  R_STALLED = 8,
};

// dial()'s onConnect status for an attempt that timed out (others: 0 connected, -errno).
#define CONNECT_TIMEOUT 1

#define CLIENT 0
#define UPSTREAM 1
#define READ_SIZE 65536
#define READS_A_WAKE 4
#define RDHUP_FIN 1
#define RDHUP_ERROR 2

typedef struct relay relay_t;

typedef struct {
  relay_t* relay;
  int fd;
  int side;
  uint32_t mask;  // the events it is watched for now (its others are dropped); 0: none
  uint32_t kmask; // the events its descriptor is in the set for (edge-triggered); 0: not in the set
  int again;      // still readable (a full read, an error behind the bytes read): asked for again
  int shared;     // its descriptor may be open elsewhere too (a dup): taken out of the set before close
  uint32_t early; // the client's events while the endpoint was dialled (edge-triggered): read at connect
  int eof;        // read to its end of stream
  int rdhup;      // its FIN has arrived (not necessarily read yet): RDHUP_FIN, or RDHUP_ERROR with an error
                  // pending (a reset may have come instead)
  int shut;       // our FIN sent to it
  int tap;        // what is read from it goes to JavaScript too (setupTap's callback)
  char* pending;  // bytes for this side that its kernel did not take yet
  size_t pendingLen;
  size_t pendingOff;
  double bytesRead;
  double bytesWritten;
} side_t;

struct relay {
  side_t sides[2];
  uv_timer_t timer;
  int32_t slot;
  int closing;  // its timer is being closed: freed in its close callback
  int reason;   // the first abort's
  int finBy;    // the first FIN's
  uint64_t lastActivity;  // loop time of the last byte read or taken by a kernel
  uint64_t timerDue;      // 0: not armed
  uint32_t idleMs;
  uint32_t halfCloseMs;
  uint32_t stallMs;
  uint32_t stallCheckMs;
  int connecting;  // dialling the endpoint (dial()): the client is not read yet
  int connectErr;  // an attempt that failed before its poll (socket() or connect() itself): reported next turn
  int queued;      // dialled with the tap: its connect and its end go through the tap's queue in a batch
};

static napi_env g_env;
static napi_ref g_on_end;
static napi_ref g_on_connect;
static napi_async_context g_async;
static uv_loop_t* g_loop;
static napi_ref g_on_tap;
static napi_ref g_tap_buf;  // the Buffer whose memory g_buf (and the tap's area after it) is, once setupTap() made it
static char g_static_buf[READ_SIZE];
static char* g_buf = g_static_buf;
// The tap's queue: what a batch has for JavaScript about its tapped relays, handed over in one call (see
// tap_flush). Small chunks are copied into the area after the read buffer, a larger one is handed over
// from the read buffer at once; each entry is TAP_FIELDS numbers in setupTap()'s Float64Array, the last
// its relay's slot. The Buffer
// ends with TAP_COPY_MAX bytes of JavaScript's own (tcp-offload.ts moves a small chunk there for its call).
#define TAP_AREA 16384
#define TAP_COPY_MAX 4096
#define TAP_ENTRIES 64
#define TAP_FIELDS 6
enum { Q_TAP = 0, Q_CONNECTED = 1, Q_ENDED = 2 };
typedef struct {
  relay_t* relay;  // valid through the batch: a relay's memory is freed by its timer's close callback
  int kind;
} queued_t;
static queued_t g_queue[TAP_ENTRIES];
static int g_queued;
static size_t g_area_used;
static double* g_tap_info;  // setupTap()'s Float64Array, TAP_FIELDS × TAP_ENTRIES
static napi_ref g_tap_info_ref;
static relay_t** g_slots;
static int32_t g_slot_count;
static int32_t g_free_head = -1;  // free slots are chained through g_next_free
static int32_t g_freed_head = -1; // slots freed during the batch, free once it is over (batch_end)
static int32_t* g_next_free;
static int32_t g_active;
static int g_epfd = -1;   // the relays' epoll set
static uv_poll_t g_epoll; // Node's loop watching it; holds the loop while relays run, as their sockets did
// The events being dispatched: a side taken out of the set meanwhile has its later ones dropped (its
// descriptor number may already be another socket's), as libuv's uv__platform_invalidate_fd does.
static struct epoll_event* g_batch;
static int g_batch_n;

static void relay_end(relay_t* r, int notify);
static void update(relay_t* r);
static int tap_chunk(relay_t* r, side_t* from, ssize_t n);

static int32_t slot_take(relay_t* r) {
  if (g_free_head < 0) {
    int32_t n = g_slot_count == 0 ? 64 : g_slot_count * 2;
    relay_t** slots = realloc(g_slots, sizeof *slots * (size_t)n);
    if (slots == NULL) return -1;
    g_slots = slots;
    int32_t* next = realloc(g_next_free, sizeof *next * (size_t)n);
    if (next == NULL) return -1;
    g_next_free = next;
    for (int32_t i = n - 1; i >= g_slot_count; i--) {
      g_slots[i] = NULL;
      g_next_free[i] = g_free_head;
      g_free_head = i;
    }
    g_slot_count = n;
  }
  int32_t s = g_free_head;
  g_free_head = g_next_free[s];
  g_slots[s] = r;
  if (g_active++ == 0) uv_ref((uv_handle_t*)&g_epoll);
  return s;
}

static int g_batching;

static void slot_free(int32_t s) {
  g_slots[s] = NULL;
  if (g_batching) {
    g_next_free[s] = g_freed_head;
    g_freed_head = s;
  } else {
    g_next_free[s] = g_free_head;
    g_free_head = s;
  }
  if (--g_active == 0) uv_unref((uv_handle_t*)&g_epoll);
}

// The slots freed during the batch become free (its queue has gone to JavaScript).
static void slots_release(void) {
  while (g_freed_head >= 0) {
    int32_t s = g_freed_head;
    g_freed_head = g_next_free[s];
    g_next_free[s] = g_free_head;
    g_free_head = s;
  }
}

static relay_t* slot_get(int32_t s) {
  return s >= 0 && s < g_slot_count ? g_slots[s] : NULL;
}

static int reset_reason(int side) {
  return side == CLIENT ? R_CLIENT_RESET : R_ENDPOINT_RESET;
}

// An error on a side: how the JavaScript relay names it (onClientError, onUpstreamError).
static int error_reason(int side, int err) {
  if (err == ECONNRESET) return reset_reason(side);
  if (side == CLIENT && err == EPIPE) return R_CLIENT_RESET;
  return R_ERROR;
}

static void abort_with(relay_t* r, int reason) {
  if (r->reason == R_NONE) r->reason = reason;
  relay_end(r, 1);
}

// Writes what waits for `to`; 1 when all of it is out, 0 when its kernel is full, -1 after an abort.
static int flush(relay_t* r, side_t* to) {
  while (to->pendingOff < to->pendingLen) {
    ssize_t n = send(to->fd, to->pending + to->pendingOff, to->pendingLen - to->pendingOff, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      abort_with(r, error_reason(to->side, errno));
      return -1;
    }
    to->pendingOff += (size_t)n;
    to->bytesWritten += (double)n;
    r->lastActivity = uv_now(g_loop);
  }
  free(to->pending);
  to->pending = NULL;
  to->pendingLen = to->pendingOff = 0;
  return 1;
}

// `from` ended and everything it sent is out: our FIN to the other side (closes both once both ended).
static int pass_fin(relay_t* r, side_t* from) {
  side_t* to = &r->sides[1 - from->side];
  if (r->finBy == R_NONE) r->finBy = from->side == CLIENT ? R_CLIENT_FIN : R_ENDPOINT_FIN;
  if (to->eof) {
    // Both ended, both flushed: close() sends the FIN after the data, as passFin's destroy().
    relay_end(r, 1);
    return -1;
  }
  if (!to->shut) {
    to->shut = 1;
    shutdown(to->fd, SHUT_WR);
  }
  return 0;
}

// The calls into JavaScript of one epoll batch share one callback scope (batch_scope.h).
static batch_scope_t g_batch_scope;
static napi_ref g_batch_resource;  // the scope's resource object (async_hooks')

// What a call into JavaScript needs open: in a batch, the batch's scopes (NULL is returned); otherwise a
// handle scope of the call's own, for js_end.
static napi_handle_scope js_begin(void) {
  napi_env env = g_env;
  napi_handle_scope scope = NULL;
  if (!g_batching) {
    napi_open_handle_scope(env, &scope);
    return scope;
  }
  batch_scope_open(env, &g_batch_scope, g_batch_resource, g_async);
  return NULL;
}

static void js_end(napi_handle_scope scope) {
  if (scope != NULL) napi_close_handle_scope(g_env, scope);
}

static void tap_flush(void);

// The batch is over: what the tap's queue holds goes to JavaScript, then its microtasks and ticks run.
static void batch_end(void) {
  tap_flush();
  g_batching = 0;
  slots_release();
  batch_scope_close(g_env, &g_batch_scope);
}

// Calls `fn_ref` with argv between js_begin and js_end: in a batch's callback scope (`this` undefined, as
// tcp_listen.c's calls: napi_get_global reads the global object from the context each time), or with
// make_callback (a timer's callback; it wants an object: the global one), which runs the microtasks and
// ticks after it, as Node's own callbacks do. A throw is the process's uncaught exception. `returned`,
// when given: whether it returned true.
static void call_js(napi_ref fn_ref, size_t argc, napi_value* argv, bool* returned) {
  napi_env env = g_env;
  napi_value fn, recv, result;
  napi_get_reference_value(env, fn_ref, &fn);
  napi_status status;
  if (g_batching) {
    napi_get_undefined(env, &recv);
    status = napi_call_function(env, recv, fn, argc, argv, &result);
  } else {
    napi_get_global(env, &recv);
    status = napi_make_callback(env, g_async, recv, fn, argc, argv, &result);
  }
  if (status == napi_pending_exception) {
    napi_value err;
    napi_get_and_clear_last_exception(env, &err);
    napi_fatal_exception(env, err);
    return;
  }
  if (returned != NULL) napi_get_value_bool(env, result, returned);
}

// Hands what the queue holds to JavaScript in one call, onTap(count): entry i is described by TAP_FIELDS
// numbers of setupTap()'s array from i × TAP_FIELDS: its kind, then
//   Q_TAP: side, offset and length of the chunk in setupTap()'s Buffer; JavaScript writes the fifth, 1
//          while the connection still wants bytes (0: both taps off for good);
//   Q_CONNECTED: the attempt connected (onConnect(slot, 0) for a relay dialled with the tap);
//   Q_ENDED: reason, bytes from the client, bytes to it (onEnd's);
// and last, the relay's slot (not reused before the batch is over: slot_free).
// A traced connection's calls into JavaScript were one a chunk, its connect and its end (four for a short
// HTTP exchange); in a batch they are one for all the batch's traced relays, whose sniffing runs back to
// back (what was measured: docs/performance-findings.md, eighth session). Called before any other call
// into JavaScript, so a connection's calls keep their order, and when the batch ends.
static void tap_flush(void) {
  int n = g_queued;
  if (n == 0) return;
  g_queued = 0;
  g_area_used = 0;
  napi_env env = g_env;
  napi_handle_scope scope = js_begin();
  napi_value argv[1];
  napi_create_int32(env, n, &argv[0]);
  call_js(g_on_tap, 1, argv, NULL);
  js_end(scope);
  for (int i = 0; i < n; i++) {
    relay_t* r = g_queue[i].relay;
    if (g_queue[i].kind == Q_TAP && g_tap_info[i * TAP_FIELDS + 4] == 0 && !r->closing)
      r->sides[CLIENT].tap = r->sides[UPSTREAM].tap = 0;
  }
}

// An entry at the queue's end (the caller made room): its fields, from the second on.
static double* enqueue(relay_t* r, int kind) {
  int i = g_queued++;
  g_queue[i].relay = r;
  g_queue[i].kind = kind;
  double* f = g_tap_info + i * TAP_FIELDS;
  f[0] = kind;
  f[4] = 0;
  f[5] = r->slot;
  return f + 1;
}

// The chunk just read from `from` (the first n bytes of g_buf) for JavaScript: queued, or (a large one, or
// outside a batch) handed over now from the read buffer; -1 when the relay ended meanwhile (JavaScript may
// abort it from a flush).
static int tap_chunk(relay_t* r, side_t* from, ssize_t n) {
  int now = !g_batching || n > TAP_COPY_MAX;
  if (now || g_queued == TAP_ENTRIES || g_area_used + (size_t)n > TAP_AREA) {
    tap_flush();
    if (r->closing) return -1;
  }
  double* f = enqueue(r, Q_TAP);
  f[0] = from->side;
  f[2] = (double)n;
  if (now) {
    f[1] = 0;
    tap_flush();
    return r->closing ? -1 : 0;
  }
  f[1] = (double)(READ_SIZE + g_area_used);
  memcpy(g_buf + READ_SIZE + g_area_used, g_buf, (size_t)n);
  g_area_used += (size_t)n;
  return 0;
}

// Reads what `from` has (once) and writes it on (and to the tap); 1 when the read filled the buffer (more
// may wait), 0 when not (or the other side holds it back), -1 after the relay ended. `disconnect`: what
// the event said of its FIN (0, RDHUP_FIN, RDHUP_ERROR).
static int pump(relay_t* r, side_t* from, int disconnect) {
  side_t* to = &r->sides[1 - from->side];
  ssize_t n;
  // recv(), not read(): a socket's read() takes the VFS's way (fdget_pos, rw_verify_area, the security
  // hook, sock_read_iter) to the same sock_recvmsg.
  do n = recv(from->fd, g_buf, READ_SIZE, 0);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    abort_with(r, error_reason(from->side, errno));
    return -1;
  }
  r->lastActivity = uv_now(g_loop);
  if (n == 0) {
    from->eof = 1;
    return pass_fin(r, from);
  }
  from->bytesRead += (double)n;
  if (disconnect > from->rdhup) from->rdhup = disconnect;
  // The FIN has come and this read drained the socket (a read takes all a socket holds, up to its size):
  // it is next, and leaves with these bytes. MSG_MORE holds them (as TCP_CORK would, without two
  // setsockopt calls) until the shutdown() after it sends them with the FIN in one segment.
  int last = from->rdhup && n < READ_SIZE && !to->shut;
  int one = 1;
  ssize_t w;
  do w = send(to->fd, g_buf, (size_t)n, last ? MSG_MORE | MSG_NOSIGNAL : MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  if (w < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      abort_with(r, error_reason(to->side, errno));
      return -1;
    }
    w = 0;
  }
  to->bytesWritten += (double)w;
  if (w < n) {
    // What was taken goes now (setting TCP_NODELAY again pushes what MSG_MORE held).
    if (last && w > 0) setsockopt(to->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    to->pending = malloc((size_t)(n - w));
    if (to->pending == NULL) {
      abort_with(r, R_ERROR);
      return -1;
    }
    memcpy(to->pending, g_buf + w, (size_t)(n - w));
    to->pendingLen = (size_t)(n - w);
    to->pendingOff = 0;
    return from->tap ? tap_chunk(r, from, n) : 0;
  }
  if (last) {
    // The EOF is there, and the FIN pushes out what MSG_MORE held. Only with an error pending is it
    // read first (a peek): a reset may have come instead.
    char byte;
    ssize_t e = from->rdhup == RDHUP_FIN ? 0 : recv(from->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (e == 0) {
      from->eof = 1;
      if (from->tap) {
        // The FIN leaves with the bytes before JavaScript sees them; the close (and JavaScript's
        // callback for it) comes after, as the JavaScript relay's 'data' comes before its 'end'.
        if (!to->shut) {
          to->shut = 1;
          shutdown(to->fd, SHUT_WR);
        }
        if (tap_chunk(r, from, n) < 0) return -1;
      }
      return pass_fin(r, from);
    }
    // A reset came instead of the FIN, and the peek took its error: it is this side's error now.
    if (e < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      abort_with(r, error_reason(from->side, errno));
      return -1;
    }
    setsockopt(to->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  if (from->tap && tap_chunk(r, from, n) < 0) return -1;
  return n == READ_SIZE;
}

static void arm_timer(relay_t* r);

// A side's events: readable while its peer can take more, writable while bytes wait for it.
static uint32_t wanted(relay_t* r, side_t* s) {
  side_t* other = &r->sides[1 - s->side];
  uint32_t m = 0;
  if (!s->eof && other->pending == NULL) m |= EPOLLIN | EPOLLRDHUP;
  // Paused: still told of a reset (an error is always reported), and of the FIN once.
  else if (!s->eof && !s->rdhup) m |= EPOLLRDHUP;
  if (s->pending != NULL) m |= EPOLLOUT;
  return m;
}

// Drops the events still to dispatch for `s` (taken out of the set, or its descriptor replaced).
static void invalidate(side_t* s) {
  for (int i = 0; i < g_batch_n; i++)
    if (g_batch[i].data.ptr == s) g_batch[i].data.ptr = NULL;
}

// Watches `s` for `m` from now on (0: its events are dropped); 0, or -errno when epoll refuses it (a
// descriptor of no socket, the per-user watch limit). A descriptor is in the set edge-triggered, for
// readable and its FIN from the first watch on and for writable from the first time it is wanted, and
// stays so till it is closed: one EPOLL_CTL_ADD a side, where changing a level-triggered watch took a
// MOD at the connect and a DEL at the end of stream (3 epoll_ctl a connection). Edge-triggered, a side
// is reported only when something changes, so what it still has when it is wanted again (readable
// after a pause, or `again`) is asked for with an EPOLL_CTL_MOD of the same events, which queues it
// when it is there, as a level-triggered watch would have reported it.
static int watch(side_t* s, uint32_t m) {
  uint32_t k = m == 0 ? s->kmask : s->kmask | m | EPOLLIN | EPOLLRDHUP;
  int ask = m != 0 && ((m & ~s->mask & EPOLLIN) != 0 || s->again);
  s->again = 0;
  if (k != s->kmask || ask) {
    struct epoll_event ev = {.events = k | EPOLLET, .data.ptr = s};
    if (epoll_ctl(g_epfd, s->kmask == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, s->fd, &ev) != 0) return -errno;
    s->kmask = k;
  }
  s->mask = m;
  return 0;
}

// Takes `s` out of the set (a failed attempt's socket, a dup before its close).
static void unwatch(side_t* s) {
  if (s->kmask != 0) epoll_ctl(g_epfd, EPOLL_CTL_DEL, s->fd, NULL);
  invalidate(s);
  s->kmask = s->mask = 0;
  s->again = 0;
}

static void update(relay_t* r) {
  for (int i = 0; i < 2; i++) {
    side_t* s = &r->sides[i];
    if (watch(s, wanted(r, s)) != 0) {
      abort_with(r, R_ERROR);
      return;
    }
  }
  arm_timer(r);
}

static void connect_done(relay_t* r, uint32_t ev);

// One side's events, as a uv_poll callback would have them: an error first (status < 0); a hang-up
// alone reads as the events it is watched for (the read finds the end or the error).
static void on_events(side_t* s, uint32_t ev) {
  relay_t* r = s->relay;
  if (r->closing) return;
  if (r->connecting) {
    // The client's events wait for the connect (it is watched edge-triggered meanwhile).
    if (s->side == UPSTREAM && (s->mask & EPOLLOUT)) connect_done(r, ev);
    else if (s->side == CLIENT) s->early |= ev;
    return;
  }
  // Not wanted now (ended, or paused with its FIN noted): its events wait, as when it was out of the set.
  if (s->mask == 0) return;
  ev &= s->mask | EPOLLERR | EPOLLHUP;
  if (ev == EPOLLERR || ev == EPOLLHUP) ev |= s->mask & (EPOLLIN | EPOLLOUT | EPOLLRDHUP);
  if (ev & EPOLLERR) {
    // A reset, mostly. What the side sent before it is still to read and pass on, as the JavaScript
    // relay's reads come before its error: one read a wake-up (the error stays pending, asked for
    // again) until the read that finds the error.
    if (s->mask & EPOLLIN) {
      double before = s->bytesRead;
      if (pump(r, s, RDHUP_ERROR) < 0) return;
      if (s->bytesRead != before || s->eof) {
        s->again = 1;
        update(r);
        return;
      }
    }
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    abort_with(r, err != 0 ? error_reason(s->side, err) : reset_reason(s->side));
    return;
  }
  side_t* other = &r->sides[1 - s->side];
  if (ev & EPOLLOUT && s->pending != NULL) {
    int done = flush(r, s);
    if (done < 0) return;
    if (done && other->eof && pass_fin(r, other) < 0) return;
  }
  if (ev & EPOLLIN && (s->mask & EPOLLIN)) {
    // A read that fills the buffer may have left more: a few a wake, then the side is asked for again
    // (edge-triggered, it is not reported again by itself).
    int disconnect = ev & EPOLLRDHUP ? RDHUP_FIN : 0;
    int more, reads = 0;
    while ((more = pump(r, s, disconnect)) == 1 && ++reads < READS_A_WAKE) {
    }
    if (more < 0) return;
    if (more == 1) s->again = 1;
  } else if (ev & EPOLLRDHUP) {
    // Paused, and its FIN came (or a hang-up, reported until something is read): not polled for it again.
    if (!s->rdhup) s->rdhup = RDHUP_FIN;
  }
  update(r);
}

// The epoll set is readable: the events of every relay that has some, at most 128 a wake (libuv comes
// back while it stays readable).
static void on_epoll(uv_poll_t* handle, int status, int events) {
  (void)handle;
  (void)status;
  (void)events;
  struct epoll_event batch[128];
  int n;
  do n = epoll_wait(g_epfd, batch, 128, 0);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return;
  g_batch = batch;
  g_batch_n = n;
  g_batching = 1;
  for (int i = 0; i < n; i++) {
    side_t* s = batch[i].data.ptr;
    if (s != NULL) on_events(s, batch[i].events);
  }
  g_batch = NULL;
  g_batch_n = 0;
  batch_end();
}

// The timeout that applies now and its reason; 0 when none.
static uint32_t timeout_of(relay_t* r, int* reason) {
  // As halfClosed(): the half-close timeout replaces the idle one, when there is one.
  int ended = r->sides[0].eof || r->sides[1].eof;
  if (ended && r->halfCloseMs > 0) {
    *reason = R_HALF_CLOSE;
    return r->halfCloseMs;
  }
  *reason = R_IDLE;
  return r->idleMs;
}

static int stalled(relay_t* r) {
  // The client is paused: the endpoint takes none of its bytes (checkStall's condition).
  return r->stallMs > 0 && r->sides[UPSTREAM].pending != NULL && !r->sides[0].eof && !r->sides[1].eof;
}

static void on_timer(uv_timer_t* timer);

static void arm_timer(relay_t* r) {
  int reason;
  uint32_t t = timeout_of(r, &reason);
  uint64_t due = 0;
  if (t > 0) due = r->lastActivity + t;
  if (stalled(r)) {
    uint64_t check = uv_now(g_loop) + r->stallCheckMs;
    if (due == 0 || check < due) due = check;
  }
  // Armed earlier is fine: it re-arms when it fires (or finds nothing due and stays off), so a timer still
  // armed for the connect's deadline is left to fire once rather than stopped and started again (a
  // stop and a start of libuv's timer heap a connection, ~0.5 % of the process under new connections).
  // Only an earlier deadline restarts it.
  if (due == 0) return;
  if (r->timerDue != 0 && r->timerDue <= due) return;
  uint64_t now = uv_now(g_loop);
  r->timerDue = due;
  uv_timer_start(&r->timer, on_timer, due > now ? due - now : 0, 0);
}

static void connect_failed(relay_t* r, int status);

static void on_timer(uv_timer_t* timer) {
  relay_t* r = (relay_t*)timer->data;
  r->timerDue = 0;
  if (r->connecting) {
    // An attempt that failed at once (connectErr), or the attempt's timeout.
    unwatch(&r->sides[UPSTREAM]);
    connect_failed(r, r->connectErr != 0 ? -r->connectErr : CONNECT_TIMEOUT);
    return;
  }
  uint64_t now = uv_now(g_loop);
  int reason;
  uint32_t t = timeout_of(r, &reason);
  if (t > 0 && now - r->lastActivity >= t) {
    abort_with(r, reason);
    return;
  }
  if (stalled(r) && now - r->lastActivity >= r->stallMs) {
    abort_with(r, R_STALLED);
    return;
  }
  arm_timer(r);
}

static void on_closed(uv_handle_t* handle) {
  free(handle->data);
}

static void set_linger0(int fd) {
  struct linger l = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
}

// Closes both descriptors (with RST when stalled, as resetAndDestroy()), frees the slot, and tells
// JavaScript when `notify`.
static void relay_end(relay_t* r, int notify) {
  if (r->closing) return;
  r->closing = 1;
  int reason = r->reason != R_NONE ? r->reason : r->finBy != R_NONE ? r->finBy : R_CLIENT_FIN;
  for (int i = 0; i < 2; i++) {
    side_t* s = &r->sides[i];
    if (reason == R_STALLED) set_linger0(s->fd);
    // close() takes a descriptor out of the set only with the last one open on its socket.
    if (s->shared) unwatch(s);
    close(s->fd);
    free(s->pending);
    s->pending = NULL;
  }
  uv_close((uv_handle_t*)&r->timer, on_closed);
  slot_free(r->slot);
  if (!notify) return;
  if (r->queued && g_batching) {
    // With the batch's other calls for traced relays (tap_flush), after this one's chunks.
    if (g_queued == TAP_ENTRIES) tap_flush();
    double* f = enqueue(r, Q_ENDED);
    f[0] = reason;
    f[1] = r->sides[CLIENT].bytesRead;
    f[2] = r->sides[CLIENT].bytesWritten;
    return;
  }
  tap_flush();
  napi_env env = g_env;
  napi_handle_scope scope = js_begin();
  napi_value argv[4];
  napi_create_int32(env, r->slot, &argv[0]);
  napi_create_int32(env, reason, &argv[1]);
  napi_create_double(env, r->sides[CLIENT].bytesRead, &argv[2]);
  napi_create_double(env, r->sides[CLIENT].bytesWritten, &argv[3]);
  call_js(g_on_end, 4, argv, NULL);
  js_end(scope);
}

static int32_t int_arg(napi_env env, napi_value v) {
  int32_t out = -1;
  napi_get_value_int32(env, v, &out);
  return out;
}

// A timeout in ms: as Node's timers take one (a socket's setTimeout), at most 2^31 - 1 (24.8 days);
// napi_get_value_int32 would keep the low 32 bits of a longer one (2^32 + 300 ms: 300 ms).
static uint32_t ms_arg(napi_env env, napi_value v) {
  double ms = 0;
  napi_get_value_double(env, v, &ms);
  if (!(ms > 0)) return 0;
  return ms < 2147483647.0 ? (uint32_t)ms : 2147483647u;
}

static napi_value int_result(napi_env env, int32_t value) {
  napi_value out;
  napi_create_int32(env, value, &out);
  return out;
}

// setup(onEnd): the callback for every connection that ends by itself; once per process (or again).
static napi_value Setup(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 1) return int_result(env, -EINVAL);
  napi_get_uv_event_loop(env, &g_loop);
  int err = epoll_set_open(g_loop, &g_epoll, on_epoll, &g_epfd);
  if (err != 0) return int_result(env, err);
  if (g_on_end != NULL) napi_delete_reference(env, g_on_end);
  napi_create_reference(env, argv[0], 1, &g_on_end);
  if (g_async == NULL) {
    napi_value name, resource;
    napi_create_string_utf8(env, "kup.tcpRelay", NAPI_AUTO_LENGTH, &name);
    napi_async_init(env, NULL, name, &g_async);
    napi_create_object(env, &resource);
    napi_create_reference(env, resource, 1, &g_batch_resource);
  }
  g_env = env;
  return int_result(env, 0);
}

// Both sides into the epoll set, for `client`'s and `upstream`'s events; 0, or -errno when epoll cannot
// watch one (a descriptor of no socket, the per-user watch limit): then neither is in it.
static int watch_sides(relay_t* r, uint32_t client, uint32_t upstream) {
  uint32_t m[2] = {client, upstream};
  for (int i = 0; i < 2; i++) {
    side_t* s = &r->sides[i];
    s->relay = r;
    s->side = i;
    int err = watch(s, m[i]);
    if (err != 0) {
      if (i == 1) unwatch(&r->sides[0]);
      return err;
    }
  }
  return 0;
}

// start(clientFd, upstreamFd, idleMs, halfCloseMs, stallMs, stallCheckMs): the relay's slot (>= 0), or
// -errno. The caller's descriptors are left to it (it closes them). Nothing is called back before it
// returns (the caller keeps the slot's owner then).
static napi_value Start(napi_env env, napi_callback_info info) {
  size_t argc = 6;
  napi_value argv[6];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 6 || g_on_end == NULL) return int_result(env, -EINVAL);
  int fds[2] = {int_arg(env, argv[0]), int_arg(env, argv[1])};
  if (fds[0] < 0 || fds[1] < 0) return int_result(env, -EBADF);
  relay_t* r = calloc(1, sizeof *r);
  if (r == NULL) return int_result(env, -ENOMEM);
  int i;
  for (i = 0; i < 2; i++) {
    int fd = fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
    if (fd < 0) break;
    r->sides[i].fd = fd;
  }
  if (i < 2) {
    int err = errno;
    if (i == 1) close(r->sides[0].fd);
    free(r);
    return int_result(env, -err);
  }
  r->slot = slot_take(r);
  if (r->slot < 0) {
    close(r->sides[0].fd);
    close(r->sides[1].fd);
    free(r);
    return int_result(env, -ENOMEM);
  }
  r->sides[CLIENT].shared = r->sides[UPSTREAM].shared = 1;
  int err = watch_sides(r, EPOLLIN | EPOLLRDHUP, EPOLLIN | EPOLLRDHUP);
  if (err != 0) {
    slot_free(r->slot);
    close(r->sides[0].fd);
    close(r->sides[1].fd);
    free(r);
    return int_result(env, err);
  }
  r->idleMs = ms_arg(env, argv[2]);
  r->halfCloseMs = ms_arg(env, argv[3]);
  r->stallMs = ms_arg(env, argv[4]);
  r->stallCheckMs = ms_arg(env, argv[5]);
  r->lastActivity = uv_now(g_loop);
  uv_timer_init(g_loop, &r->timer);
  // Never holds the process by itself (the epoll set does while relays run, as the sockets did).
  uv_unref((uv_handle_t*)&r->timer);
  r->timer.data = r;
  // Both sides are watched for what update() would ask (nothing waits yet): only the timer is left.
  arm_timer(r);
  return int_result(env, r->slot);
}

// Dialling. dial() takes the client's descriptor (a dup, as start()) and connects to the endpoint itself
// (socket, TCP_NODELAY, a non-blocking connect, watched for writable, SO_ERROR), instead of Node's
// net.connect: no net.Socket and libuv handle built only to be handed over. JavaScript still picks every
// endpoint: it hears of each attempt's end once, onConnect(slot, status) (0: connected, the relay runs
// from there on; -errno; CONNECT_TIMEOUT), and dials the next endpoint on the same slot (redial) or
// aborts. A retry's socket takes the failed one's descriptor number (dup3).

// onConnect(slot, status); the last thing its caller does (JavaScript may redial or abort from it). A
// relay dialled with the tap that connected is told in the batch's call for its traced relays (tap_flush),
// before its first chunks.
static void notify_connect(relay_t* r, int status) {
  if (r->queued && status == 0 && g_batching) {
    if (g_queued == TAP_ENTRIES) {
      tap_flush();
      if (r->closing) return;
    }
    enqueue(r, Q_CONNECTED);
    return;
  }
  tap_flush();
  if (r->closing) return;
  napi_env env = g_env;
  napi_handle_scope scope = js_begin();
  napi_value argv[2];
  napi_create_int32(env, r->slot, &argv[0]);
  napi_create_int32(env, status, &argv[1]);
  call_js(g_on_connect, 2, argv, NULL);
  js_end(scope);
}

// The attempt failed: its socket stays (closed by the next attempt's dup3, or with the relay).
static void connect_failed(relay_t* r, int status) {
  uv_timer_stop(&r->timer);
  uv_unref((uv_handle_t*)&r->timer);
  r->timerDue = 0;
  notify_connect(r, status);
}

// The upstream socket's first event since its connect(): writable (connected), or a failed connect,
// which is reported with an error and a hang-up (SO_ERROR, asked only then, says which error).
static void connect_done(relay_t* r, uint32_t ev) {
  side_t* up = &r->sides[UPSTREAM];
  if (ev & (EPOLLERR | EPOLLHUP)) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(up->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == 0) err = EBADF;
    unwatch(up);
    connect_failed(r, -err);
    return;
  }
  // The connect's timer stays armed (arm_timer): it fires once more at most, after the relay may be over.
  uv_unref((uv_handle_t*)&r->timer);
  r->connecting = 0;
  r->lastActivity = uv_now(g_loop);
  // In the set for readable and its FIN since its connect(): what came with the connect is in `ev`,
  // passed on below (no EPOLL_CTL_MOD to ask for it).
  up->mask = EPOLLIN | EPOLLRDHUP;
  update(r);
  if (r->closing) return;
  notify_connect(r, 0);
  // What the client sent meanwhile (a request, mostly) goes now, not a turn of the loop later; after
  // JavaScript heard of the connect (or it was queued before the chunks), which may have ended the relay.
  // Then what the endpoint sent (a server-first protocol's greeting), reported with the connect.
  side_t* client = &r->sides[CLIENT];
  uint32_t early = client->early;
  client->early = 0;
  if (early != 0 && !r->closing) on_events(client, early);
  if ((ev & (EPOLLIN | EPOLLRDHUP)) != 0 && !r->closing) on_events(up, ev);
}

// The attempt failed before its poll: told on the next turn of the loop, as a connect error would be.
static void fail_next_turn(relay_t* r, int err) {
  r->connecting = 1;
  r->connectErr = err;
  uv_ref((uv_handle_t*)&r->timer);
  uv_timer_start(&r->timer, on_timer, 0, 0);
}

// Issues connect() on the upstream socket and polls for its outcome.
static void start_connect(relay_t* r, const struct sockaddr_storage* addr, socklen_t len, uint32_t timeoutMs) {
  side_t* up = &r->sides[UPSTREAM];
  r->connecting = 1;
  r->connectErr = 0;
  if (connect(up->fd, (const struct sockaddr*)addr, len) != 0 && errno != EINPROGRESS && errno != EINTR) {
    fail_next_turn(r, errno);
    return;
  }
  int err = watch(up, EPOLLOUT);
  if (err != 0) {
    fail_next_turn(r, -err);
    return;
  }
  if (timeoutMs > 0) {
    uv_ref((uv_handle_t*)&r->timer);
    r->timerDue = uv_now(g_loop) + timeoutMs;
    uv_timer_start(&r->timer, on_timer, timeoutMs, 0);
  }
}

// The endpoint's address from its IP (either family) and port; 0 or -EINVAL.
static int endpoint_addr(napi_env env, napi_value ip, napi_value port, struct sockaddr_storage* addr,
                         socklen_t* len) {
  char text[INET6_ADDRSTRLEN];
  size_t n = 0;
  if (napi_get_value_string_utf8(env, ip, text, sizeof text, &n) != napi_ok) return -EINVAL;
  int32_t p = int_arg(env, port);
  if (p <= 0 || p > 65535) return -EINVAL;
  memset(addr, 0, sizeof *addr);
  struct sockaddr_in* a4 = (struct sockaddr_in*)addr;
  struct sockaddr_in6* a6 = (struct sockaddr_in6*)addr;
  if (inet_pton(AF_INET, text, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)p);
    *len = sizeof *a4;
  } else if (inet_pton(AF_INET6, text, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)p);
    *len = sizeof *a6;
  } else
    return -EINVAL;
  return 0;
}

// A socket towards the endpoint, with Nagle off (net.connect's noDelay); the descriptor or -errno.
static int endpoint_socket(int family) {
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// setupDial(onConnect): the callback for every attempt's end; once per process (or again).
static napi_value SetupDial(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 1 || g_on_end == NULL) return int_result(env, -EINVAL);
  if (g_on_connect != NULL) napi_delete_reference(env, g_on_connect);
  napi_create_reference(env, argv[0], 1, &g_on_connect);
  return int_result(env, 0);
}

// dial(clientFd, ip, port, connectTimeoutMs, idleMs, halfCloseMs, stallMs, stallCheckMs, take, tap): the
// relay's slot (>= 0), connecting; or -errno when nothing was started (no socket, no dup: the caller
// dials the way it did before); nothing is called back before it returns (a failure to connect at once
// is told on the next turn). The client's descriptor is left to the caller (it closes it), unless
// `take` is 1 (a descriptor of no socket's, from the native listener): then it is the relay's, no dup.
// `tap` (as tap()'s mask; setupTap() first) taps it from its first byte, and its connect and its end are
// told with its chunks (tap_flush).
static napi_value Dial(napi_env env, napi_callback_info info) {
  size_t argc = 10;
  napi_value argv[10];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  int take = argc >= 9 && int_arg(env, argv[8]) == 1;
  int32_t tap = argc >= 10 && g_on_tap != NULL ? int_arg(env, argv[9]) : 0;
  if (argc < 8 || g_on_end == NULL || g_on_connect == NULL) return int_result(env, -EINVAL);
  int clientFd = int_arg(env, argv[0]);
  if (clientFd < 0) return int_result(env, -EBADF);
  struct sockaddr_storage addr;
  socklen_t len;
  int err = endpoint_addr(env, argv[1], argv[2], &addr, &len);
  if (err != 0) return int_result(env, err);
  int upstreamFd = endpoint_socket(addr.ss_family);
  if (upstreamFd < 0) return int_result(env, upstreamFd);
  int fd = take ? clientFd : fcntl(clientFd, F_DUPFD_CLOEXEC, 0);
  relay_t* r = fd < 0 ? NULL : calloc(1, sizeof *r);
  if (r == NULL) {
    err = fd < 0 ? errno : ENOMEM;
    if (fd >= 0 && !take) close(fd);
    close(upstreamFd);
    return int_result(env, -err);
  }
  r->slot = slot_take(r);
  if (r->slot < 0) {
    if (!take) close(fd);
    close(upstreamFd);
    free(r);
    return int_result(env, -ENOMEM);
  }
  int32_t slot = r->slot;
  r->sides[CLIENT].fd = fd;
  r->sides[UPSTREAM].fd = upstreamFd;
  r->sides[CLIENT].shared = !take;
  // The client is watched from now on, so that epoll's refusal is dial()'s error; its events wait for
  // the connect (`early`).
  err = watch_sides(r, EPOLLIN | EPOLLRDHUP, 0);
  if (err != 0) {
    // The client's descriptor stays the caller's (it relays it in JavaScript), the listener's too.
    slot_free(slot);
    if (!take) close(fd);
    close(upstreamFd);
    free(r);
    return int_result(env, err);
  }
  r->idleMs = ms_arg(env, argv[4]);
  r->halfCloseMs = ms_arg(env, argv[5]);
  r->stallMs = ms_arg(env, argv[6]);
  r->stallCheckMs = ms_arg(env, argv[7]);
  if (tap > 0) {
    r->sides[CLIENT].tap = (tap & 1) != 0;
    r->sides[UPSTREAM].tap = (tap & 2) != 0;
    r->queued = 1;
  }
  uv_timer_init(g_loop, &r->timer);
  uv_unref((uv_handle_t*)&r->timer);
  r->timer.data = r;
  start_connect(r, &addr, len, ms_arg(env, argv[3]));
  return int_result(env, r->slot);
}

// redial(slot, ip, port, connectTimeoutMs): the next attempt of a relay still connecting; 0, -ENOENT
// (no such relay, or it is connected), -EINVAL. A socket that cannot be made is reported as onConnect.
static napi_value Redial(napi_env env, napi_callback_info info) {
  size_t argc = 4;
  napi_value argv[4];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  relay_t* r = argc < 4 ? NULL : slot_get(int_arg(env, argv[0]));
  if (r == NULL || !r->connecting || r->closing) return int_result(env, -ENOENT);
  struct sockaddr_storage addr;
  socklen_t len;
  int err = endpoint_addr(env, argv[1], argv[2], &addr, &len);
  if (err != 0) return int_result(env, err);
  int fd = endpoint_socket(addr.ss_family);
  if (fd < 0) {
    fail_next_turn(r, -fd);
    return int_result(env, 0);
  }
  // The new socket under the old one's number (the old one, out of the set, is closed by it).
  int rc = dup3(fd, r->sides[UPSTREAM].fd, O_CLOEXEC);
  err = errno;
  close(fd);
  if (rc < 0) fail_next_turn(r, err);
  else start_connect(r, &addr, len, ms_arg(env, argv[3]));
  return int_result(env, 0);
}

// localName(slot): [address, port] of the upstream socket (its connect() issued), or undefined.
static napi_value LocalName(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  relay_t* r = argc < 1 ? NULL : slot_get(int_arg(env, argv[0]));
  return local_name_js(env, r == NULL ? -1 : r->sides[UPSTREAM].fd);
}

// setupTap(onTap, info): the callback of the tap's queue (tap_flush: onTap(count)), and `info`, a
// Float64Array of TAP_FIELDS × TAP_ENTRIES numbers, where its entries are described; returns the Buffer the
// chunks' offsets point into (the read buffer, the queue's area, and TAP_COPY_MAX bytes for JavaScript).
static napi_value SetupTap(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 2 || g_on_end == NULL) return int_result(env, -EINVAL);
  double* fields;
  size_t length;
  napi_typedarray_type type;
  if (napi_get_typedarray_info(env, argv[1], &type, &length, (void**)&fields, NULL, NULL) != napi_ok ||
      type != napi_float64_array || length < TAP_FIELDS * TAP_ENTRIES)
    return int_result(env, -EINVAL);
  napi_value buf;
  void* data;
  if (g_tap_buf == NULL) {
    if (napi_create_buffer(env, READ_SIZE + TAP_AREA + TAP_COPY_MAX, &data, &buf) != napi_ok) return int_result(env, -ENOMEM);
    napi_create_reference(env, buf, 1, &g_tap_buf);
    g_buf = data;
  } else napi_get_reference_value(env, g_tap_buf, &buf);
  if (g_tap_info_ref != NULL) napi_delete_reference(env, g_tap_info_ref);
  napi_create_reference(env, argv[1], 1, &g_tap_info_ref);
  g_tap_info = fields;
  if (g_on_tap != NULL) napi_delete_reference(env, g_on_tap);
  napi_create_reference(env, argv[0], 1, &g_on_tap);
  return buf;
}

// tap(slot, mask): the taps on (1: the client's bytes, 2: the endpoint's) or off; 0, or -ENOENT.
static napi_value Tap(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  relay_t* r = argc < 2 ? NULL : slot_get(int_arg(env, argv[0]));
  if (r == NULL) return int_result(env, -ENOENT);
  if (g_on_tap == NULL) return int_result(env, -EINVAL);
  int32_t mask = int_arg(env, argv[1]);
  r->sides[CLIENT].tap = (mask & 1) != 0;
  r->sides[UPSTREAM].tap = (mask & 2) != 0;
  return int_result(env, 0);
}

// counts(slot, out): out[0] bytes read from the client, out[1] bytes written to it; 0, or -ENOENT.
static napi_value Counts(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  relay_t* r = argc < 2 ? NULL : slot_get(int_arg(env, argv[0]));
  if (r == NULL) return int_result(env, -ENOENT);
  double* data;
  size_t length;
  napi_typedarray_type type;
  if (napi_get_typedarray_info(env, argv[1], &type, &length, (void**)&data, NULL, NULL) != napi_ok ||
      type != napi_float64_array || length < 2)
    return int_result(env, -EINVAL);
  data[0] = r->sides[CLIENT].bytesRead;
  data[1] = r->sides[CLIENT].bytesWritten;
  return int_result(env, 0);
}

// abort(slot, reset): closes both sides now (with RST when `reset`), without the callback.
static napi_value Abort(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  relay_t* r = argc < 2 ? NULL : slot_get(int_arg(env, argv[0]));
  if (r == NULL) return int_result(env, -ENOENT);
  if (int_arg(env, argv[1]) == 1) r->reason = R_STALLED;
  relay_end(r, 0);
  return int_result(env, 0);
}

static int keepalive(int fd, int delay) {
  int one = 1, intvl = 1, cnt = 10;
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0) return -errno;
  if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &delay, sizeof delay) != 0) return -errno;
  if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) != 0) return -errno;
  if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) != 0) return -errno;
  return 0;
}

// keepAlive(slot, delaySeconds): TCP keep-alive on both sides, as libuv's uv_tcp_keepalive; 0 or -errno.
static napi_value KeepAlive(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  relay_t* r = argc < 2 ? NULL : slot_get(int_arg(env, argv[0]));
  if (r == NULL) return int_result(env, -ENOENT);
  int delay = int_arg(env, argv[1]);
  if (delay < 1) delay = 1;
  int a = keepalive(r->sides[0].fd, delay);
  int b = keepalive(r->sides[1].fd, delay);
  return int_result(env, a != 0 ? a : b);
}

// held(slot): 1 when the client is held back (bytes for the endpoint wait), 2 when the endpoint is (bytes
// for the client wait), 3 both, 0 neither; -ENOENT.
static napi_value Held(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  relay_t* r = argc < 1 ? NULL : slot_get(int_arg(env, argv[0]));
  if (r == NULL) return int_result(env, -ENOENT);
  return int_result(env, (r->sides[UPSTREAM].pending != NULL) | (r->sides[CLIENT].pending != NULL) << 1);
}

// active(): relays running in this process.
static napi_value Active(napi_env env, napi_callback_info info) {
  (void)info;
  return int_result(env, g_active);
}

static napi_value Init(napi_env env, napi_value exports) {
  napi_property_descriptor props[] = {
      {"setup", NULL, Setup, NULL, NULL, NULL, napi_enumerable, NULL},
      {"start", NULL, Start, NULL, NULL, NULL, napi_enumerable, NULL},
      {"counts", NULL, Counts, NULL, NULL, NULL, napi_enumerable, NULL},
      {"abort", NULL, Abort, NULL, NULL, NULL, napi_enumerable, NULL},
      {"keepAlive", NULL, KeepAlive, NULL, NULL, NULL, napi_enumerable, NULL},
      {"held", NULL, Held, NULL, NULL, NULL, napi_enumerable, NULL},
      {"active", NULL, Active, NULL, NULL, NULL, napi_enumerable, NULL},
      {"setupDial", NULL, SetupDial, NULL, NULL, NULL, napi_enumerable, NULL},
      {"dial", NULL, Dial, NULL, NULL, NULL, napi_enumerable, NULL},
      {"redial", NULL, Redial, NULL, NULL, NULL, napi_enumerable, NULL},
      {"localName", NULL, LocalName, NULL, NULL, NULL, napi_enumerable, NULL},
      {"setupTap", NULL, SetupTap, NULL, NULL, NULL, napi_enumerable, NULL},
      {"tap", NULL, Tap, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  napi_define_properties(env, exports, sizeof props / sizeof props[0], props);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
