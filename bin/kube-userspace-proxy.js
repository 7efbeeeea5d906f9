#!/usr/bin/env node
// The CLI. In a checkout it runs src/ directly (Node >= 22.18 strips types); installed as a package it
// runs the compiled dist/ (Node will not strip types under node_modules).

// First, before anything else can run: SIGUSR1 would open Node's inspector on 127.0.0.1:9229, and then any
// local process (every host-network pod) could run code as root in here. A listener keeps Node from doing
// that (the image also starts Node with --disable-sigusr1). The benchmark's memory measures, which need a
// full garbage collection through the inspector, ask for it with KUP_INSPECTOR_SIGNAL=1; nothing else can.
if (process.env.KUP_INSPECTOR_SIGNAL !== '1') process.on('SIGUSR1', () => {});
const [major, minor] = process.versions.node.split('.').map(Number);
if (major < 22 || (major === 22 && minor < 19)) {
  process.stderr.write(
    `kube-userspace-proxy needs Node >= 22.19 (this is ${process.version}); run it through npm (npm start) or install Node 24.\n`,
  );
  process.exit(2);
}
const fromPackage = import.meta.url.includes('/node_modules/');
const { main } = await import(fromPackage ? '../dist/main.js' : '../src/main.ts');
const code = await main(process.argv.slice(2));
// Let pino flush, then exit with the code (open handles must not keep a stopped proxy alive).
setImmediate(() => process.exit(code));
