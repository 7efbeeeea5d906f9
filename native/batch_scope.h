// One callback scope for the calls into JavaScript of one batch (tcp_listen.c: an accept wake;
// tcp_relay.c: an epoll batch), opened at the first of them and closed when the batch is over: the
// microtasks and ticks run once, after the last call, as after one of Node's own callbacks, instead of
// after each (napi_make_callback's scope). The calls' values live in the batch's handle scope till then.
#ifndef KUP_BATCH_SCOPE_H
#define KUP_BATCH_SCOPE_H

#include <node_api.h>

typedef struct {
  napi_handle_scope handles;
  napi_callback_scope callback;  // NULL: not open
} batch_scope_t;

// Opens the batch's scopes, with `resource` as the callback scope's resource, unless they are open.
static inline void batch_scope_open(napi_env env, batch_scope_t* b, napi_ref resource,
                                    napi_async_context async) {
  if (b->callback != NULL) return;
  napi_open_handle_scope(env, &b->handles);
  napi_value r;
  napi_get_reference_value(env, resource, &r);
  napi_open_callback_scope(env, r, async, &b->callback);
}

// The batch is over: closes its scopes if they were opened (the microtasks and ticks run now).
static inline void batch_scope_close(napi_env env, batch_scope_t* b) {
  if (b->callback == NULL) return;
  napi_close_callback_scope(env, b->callback);
  napi_close_handle_scope(env, b->handles);
  b->callback = NULL;
}

#endif
