// `npm run demo`: two tiny "pods" on loopback (127.0.0.11 and 127.0.0.12, HTTP on 8080, UDP echo on
// 5353) and the proxy on examples/demo.yaml with --no-iptables. Prints where to send requests.
import { spawn } from 'node:child_process';
import dgram from 'node:dgram';
import http from 'node:http';
import { fileURLToPath } from 'node:url';

const pods = [
  { name: 'echo-pod-a', ip: '127.0.0.11' },
  { name: 'echo-pod-b', ip: '127.0.0.12' },
];
for (const pod of pods) {
  http
    .createServer((req, res) => {
      res.setHeader('content-type', 'text/plain');
      res.end(`hello from ${pod.name} (${pod.ip}): ${req.method} ${req.url}\n`);
    })
    .listen(8080, pod.ip);
  const udp = dgram.createSocket('udp4');
  udp.on('message', (msg, from) => udp.send(`${pod.name}: ${msg}`, from.port, from.address));
  udp.bind(5353, pod.ip);
}

const manifest = fileURLToPath(new URL('demo.yaml', import.meta.url));
const bin = fileURLToPath(new URL('../bin/kube-userspace-proxy.js', import.meta.url));
const args = [
  bin,
  '--manifest',
  manifest,
  '--no-iptables',
  '--proxy-port-range',
  '20080-20099',
  '--hostname-override',
  'demo-node',
  '--healthz-bind-address',
  '127.0.0.1:10256',
  '--metrics-bind-address',
  '127.0.0.1:10249',
  '--log-format',
  'text',
  ...process.argv.slice(2),
];
const proxy = spawn(process.execPath, args, { stdio: 'inherit' });
proxy.on('exit', (code) => process.exit(code ?? 0));
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => proxy.kill(sig));

// Once the proxy serves, print where each service port listens.
for (let i = 0; i < 50; i++) {
  await new Promise((r) => setTimeout(r, 100));
  try {
    const res = await fetch('http://127.0.0.1:10249/debug/services');
    const ports = (await res.json()) as {
      service: string;
      protocol: string;
      proxyPort: number;
      endpoints: string[];
    }[];
    if (ports.length === 0) continue;
    const lines = ports.map(
      (p) =>
        `  ${p.service} (${p.protocol}) → 127.0.0.1:${p.proxyPort}   endpoints ${p.endpoints.join(', ')}`,
    );
    const web = ports.find((p) => p.service === 'demo/echo:http');
    const udp = ports.find((p) => p.service === 'demo/echo:udp');
    process.stdout.write(
      `\nkube-userspace-proxy is serving examples/demo.yaml:\n${lines.join('\n')}\n\nTry:\n` +
        `  curl http://127.0.0.1:${web?.proxyPort}/     (round robin: run it twice)\n` +
        `  echo hi | nc -u -w1 127.0.0.1 ${udp?.proxyPort}\n` +
        '  open http://127.0.0.1:10249/ui/   (the live console)\n' +
        '  curl -s http://127.0.0.1:10249/debug/services | head\n' +
        '  curl -s http://127.0.0.1:10256/healthz\n' +
        'Edit examples/demo.yaml to add, change or remove services and endpoints. Ctrl-C stops.\n\n',
    );
    break;
  } catch {
    // not up yet
  }
}
