// The rig's fixed addresses and the text of every file it writes: manifests, the backends' nginx, HAProxy
// and nginx stream configurations (equivalent: same backends, round robin, no logging). Pure: text only.
import { NGINX_STREAM_MODULE } from './tools.ts';

/** Addresses and ports of the rig (fixed, so configs and results read the same every run). */
export const NET = {
  client: '10.244.0.10',
  backends: ['10.244.0.11', '10.244.0.12'] as const,
  /**
   * Second addresses of the backend pods (pod1: .21 and .23, pod2: .22), where their nginx answers too:
   * the scale measure's Services have five endpoints each (10,000 Services, 50,000 endpoints), all real.
   */
  secondaryIPs: [['10.244.0.21', '10.244.0.23'], ['10.244.0.22']] as const,
  nodeIP: '192.168.50.2',
  node2IP: '10.244.0.2',
  /** node3 runs `proxy-w1` (only with --workers-compare); the client routes 10.98.0.0/16 to it. */
  node3IP: '10.244.0.3',
  httpPort: 8080,
  iperfPort: 5201,
  dnsPort: 53,
  /**
   * ClusterIPs of the proxy on the node (10.96/16), of the --trace=none proxy on node2 (10.97/16) and of
   * `proxy-w1` on node3 (10.98/16).
   */
  clusterIPs: { http: '10.96.0.10', iperf: '10.96.0.20', dns: '10.96.0.53' },
  clusterIPs2: { http: '10.97.0.10', iperf: '10.97.0.20', dns: '10.97.0.53' },
  clusterIPs3: { http: '10.98.0.10', iperf: '10.98.0.20', dns: '10.98.0.53' },
  haproxy: { http: 18080, iperf: 18201 },
  /** `dns`: UDP with proxy_responses 1; `dnsSessions`: UDP sessions kept (proxy_timeout 1s). */
  nginx: { http: 19080, iperf: 19201, dns: 19053, dnsSessions: 19054 },
  proxyPortRange: '20000-20999',
  metricsPort: 10249,
} as const;

export function serviceYaml(
  name: string,
  ip: string,
  protocol: 'TCP' | 'UDP',
  port: number,
  targetPort: number,
) {
  return `apiVersion: v1
kind: Service
metadata: { name: ${name}, namespace: bench }
spec:
  clusterIP: ${ip}
  clusterIPs: [${ip}]
  ports: [{ name: p, protocol: ${protocol}, port: ${port}, targetPort: ${targetPort} }]
`;
}

export function sliceYaml(name: string, ips: readonly string[], protocol: 'TCP' | 'UDP', port: number) {
  return `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: ${name}-1, namespace: bench, labels: { kubernetes.io/service-name: ${name} } }
addressType: IPv4
ports: [{ name: p, protocol: ${protocol}, port: ${port} }]
endpoints:
${ips.map((ip) => `  - { addresses: [${ip}], conditions: { ready: true } }`).join('\n')}
`;
}

/** An HTTP backend: one worker, `return 200 "podN\n"`, no access log, long keep-alive. */
export function backendNginxConf(
  dir: string,
  name: string,
  ip: string,
  more: readonly string[] = [],
): string {
  return `daemon off;
master_process on;
worker_processes 1;
user root;
pid ${dir}/${name}-nginx.pid;
error_log ${dir}/${name}-error.log error;
worker_rlimit_nofile 20000;
events { worker_connections 16384; }
http {
  access_log off;
  client_body_temp_path ${dir}/${name}-body;
  proxy_temp_path ${dir}/${name}-proxy;
  fastcgi_temp_path ${dir}/${name}-fastcgi;
  uwsgi_temp_path ${dir}/${name}-uwsgi;
  scgi_temp_path ${dir}/${name}-scgi;
  keepalive_timeout 600s;
  keepalive_requests 100000000;
  server {
    listen ${ip}:${NET.httpPort} backlog=4096;${more.map((a) => `\n    listen ${a}:${NET.httpPort} backlog=4096;`).join('')}
    location / { return 200 "${name}\\n"; }
  }
}
`;
}

/** HAProxy: mode tcp, round robin over the same backends, nbthread = cores, no logging. */
export function haproxyConf(cores: number): string {
  const [b1, b2] = NET.backends;
  return `global
  nbthread ${cores}
  maxconn 8000

defaults
  mode tcp
  timeout connect 5s
  timeout client 1h
  timeout server 1h
  timeout client-fin 30s
  timeout server-fin 30s

frontend http
  bind ${NET.nodeIP}:${NET.haproxy.http}
  default_backend http

backend http
  balance roundrobin
  server b1 ${b1}:${NET.httpPort}
  server b2 ${b2}:${NET.httpPort}

frontend iperf
  bind ${NET.nodeIP}:${NET.haproxy.iperf}
  default_backend iperf

backend iperf
  server b1 ${b1}:${NET.iperfPort}
`;
}

/**
 * nginx stream: worker_processes = cores, round robin, no access log. UDP twice: with proxy_responses 1
 * (a session ends with its answer) and keeping sessions (no proxy_responses; a session ends after 1 s
 * without datagrams), the two ways nginx is run in front of DNS; the benchmark compares with the stronger.
 */
export function streamNginxConf(dir: string, cores: number): string {
  const [b1, b2] = NET.backends;
  return `load_module ${NGINX_STREAM_MODULE};
daemon off;
master_process on;
worker_processes ${cores};
user root;
pid ${dir}/stream-nginx.pid;
error_log ${dir}/stream-error.log error;
worker_rlimit_nofile 20000;
events { worker_connections 16384; }
stream {
  upstream http { server ${b1}:${NET.httpPort}; server ${b2}:${NET.httpPort}; }
  upstream iperf { server ${b1}:${NET.iperfPort}; }
  upstream dns { server ${b1}:${NET.dnsPort}; server ${b2}:${NET.dnsPort}; }
  server { listen ${NET.nodeIP}:${NET.nginx.http} backlog=4096; proxy_pass http; }
  server { listen ${NET.nodeIP}:${NET.nginx.iperf}; proxy_pass iperf; }
  # reuseport: one UDP socket per worker, so both workers take datagrams.
  server { listen ${NET.nodeIP}:${NET.nginx.dns} udp reuseport; proxy_pass dns; proxy_responses 1; }
  server { listen ${NET.nodeIP}:${NET.nginx.dnsSessions} udp reuseport; proxy_pass dns; proxy_timeout 1s; }
}
`;
}
