// An epoll set of an addon's own, watched by Node's loop as one descriptor (one uv_poll for all it
// holds): tcp_relay.c's relays, tcp_listen.c's listeners. Made once per process, unreferenced (the
// addon refs its poll while the set holds something).
#ifndef KUP_EPOLL_SET_H
#define KUP_EPOLL_SET_H

#include <errno.h>
#include <sys/epoll.h>
#include <unistd.h>
#include <uv.h>

// Makes the set and starts `poll` on it with `cb`, unless *epfd is one already; 0, -errno or libuv's error.
static inline int epoll_set_open(uv_loop_t* loop, uv_poll_t* poll, uv_poll_cb cb, int* epfd) {
  if (*epfd >= 0) return 0;
  int fd = epoll_create1(EPOLL_CLOEXEC);
  if (fd < 0) return -errno;
  int err = uv_poll_init(loop, poll, fd);
  if (err != 0) {
    close(fd);
    return err;
  }
  *epfd = fd;
  uv_poll_start(poll, UV_READABLE, cb);
  uv_unref((uv_handle_t*)poll);
  return 0;
}

#endif
