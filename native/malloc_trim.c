// malloc_trim: hands the C heap's free memory back to the kernel (glibc's malloc_trim(3)), which free()
// alone does not: after a cold start's peak (the API's list pages, the rules' text) glibc keeps the freed
// pages of its arenas as RSS (src/lib/malloc-trim.ts says when it is called). And a fixed trim threshold:
// the free memory at the top of a thread's arena goes back on free() past it, which malloc_trim() does
// not do for any arena but the main one.
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

// setTrimThreshold(bytes): mallopt(M_TRIM_THRESHOLD): free memory an arena keeps at its top at most
// (which also stops glibc raising it, and its mmap threshold, as large blocks are freed); 1 when set.
static napi_value SetTrimThreshold(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  int32_t bytes = -1;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc >= 1) napi_get_value_int32(env, argv[0], &bytes);
  napi_value out;
  napi_create_int32(env, bytes >= 0 && mallopt(M_TRIM_THRESHOLD, bytes) == 1, &out);
  return out;
}

NAPI_MODULE_INIT() {
  napi_property_descriptor props[] = {
      {"trim", NULL, Trim, NULL, NULL, NULL, napi_enumerable, NULL},
      {"setTrimThreshold", NULL, SetTrimThreshold, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  if (napi_define_properties(env, exports, sizeof props / sizeof props[0], props) != napi_ok) return NULL;
  return exports;
}
