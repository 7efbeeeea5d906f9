#!/usr/bin/env node
// The CLI. In a checkout it runs src/ directly (Node >= 22.18 strips types); installed as a package it
// runs the compiled dist/ (Node will not strip types under node_modules).
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
