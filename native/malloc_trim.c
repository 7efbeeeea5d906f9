// malloc_trim: hands the C heap's free memory back to the kernel (glibc's malloc_trim(3)), which free()
// alone does not: after a cold start's peak (the API's list pages, the rules' text) glibc keeps the freed
// pages of its arenas as RSS (src/lib/malloc-trim.ts says when it is called).
//
// Node-API only (no V8 or libuv headers): one binary works on every Node version the package supports.
#include <malloc.h>
#include <node_api.h>

// trim(): 1 when memory was given back, 0 when there was none to give.
static napi_value Trim(napi_env env, napi_callback_info info) {
  (void)info;
  napi_value out;
  napi_create_int32(env, malloc_trim(0), &out);
  return out;
}

NAPI_MODULE_INIT() {
  napi_value fn;
  if (napi_create_function(env, "trim", NAPI_AUTO_LENGTH, Trim, NULL, &fn) != napi_ok) return NULL;
  if (napi_set_named_property(env, exports, "trim", fn) != napi_ok) return NULL;
  return exports;
}
