// A worker process's first import: SIGUSR1 must not open Node's inspector in a worker either (code
// execution as root for anyone on the host's loopback; the main process's bin does the same). The pool
// also starts workers with --disable-sigusr1, which closes the window before this runs but would let the
// signal kill the worker: this listener ignores it. KUP_INSPECTOR_SIGNAL=1 (the benchmark's switch, for
// a full garbage collection through the inspector) leaves Node's handler, on a port of the kernel's
// choosing (worker-pool.ts), so it does not fight the main process for 9229.
if (process.env.KUP_INSPECTOR_SIGNAL !== '1') process.on('SIGUSR1', () => {});
