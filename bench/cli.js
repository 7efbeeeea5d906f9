#!/usr/bin/env node
// The proxy's CLI as an installed package runs it: the compiled dist/ (the harness builds it at the
// start of each run), not src/ through type stripping, which adds about 0.8 s to every start.
const { main } = await import('../dist/main.js');
const code = await main(process.argv.slice(2));
// As bin/kube-userspace-proxy.js: let pino flush, then exit with the code.
setImmediate(() => process.exit(code));
