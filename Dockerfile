# kube-userspace-proxy image: Node 24 on Debian slim with iptables (nft and legacy backends), conntrack and
# iproute2. Build: docker build -t kube-userspace-proxy .   Deploy: deploy/kube-userspace-proxy.yaml.

# Build stage: dev dependencies, compile src/ to dist/ and native/ to build/native/, then a production-only
# node_modules.
FROM node:24-trixie-slim AS build
# A C compiler for native/*.c: tcp_fin.c (the endpoint's FIN with its last bytes, src/relay/tcp-fin.ts),
# tcp_relay.c (established connections relayed in C on Node's loop, src/relay/tcp-offload.ts),
# tcp_listen.c (service ports' listening sockets, accept4 on Node's loop, src/relay/tcp-accept.ts),
# udp_fast.c (established UDP sessions relayed without JavaScript, src/relay/udp-fast.ts),
# malloc_trim.c (malloc's free pages back after the cold start, src/lib/malloc-trim.ts).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY package.json package-lock.json ./
COPY scripts/build-native.ts ./scripts/
COPY native ./native
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npm run build \
 && npm ci --omit=dev --ignore-scripts --no-audit --no-fund

FROM node:24-trixie-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables conntrack iproute2 \
 && rm -rf /var/lib/apt/lists/*
# iptables, ip6tables and their -save/-restore run the host's backend (nft or legacy), chosen on first use.
COPY --chmod=0755 deploy/image/iptables-wrapper /usr/sbin/iptables-wrapper
RUN /usr/sbin/iptables-wrapper --install
# Laid out as `npm install -g` would: under node_modules the CLI runs the compiled dist/.
WORKDIR /usr/local/lib/node_modules/kube-userspace-proxy
COPY --from=build /build/package.json ./
COPY --from=build /build/node_modules ./node_modules
COPY --from=build /build/dist ./dist
COPY --from=build /build/build/native ./build/native
COPY bin ./bin
COPY ui ./ui
RUN ln -s /usr/local/lib/node_modules/kube-userspace-proxy/bin/kube-userspace-proxy.js /usr/local/bin/kube-userspace-proxy \
 && node bin/kube-userspace-proxy.js --version
ENV NODE_ENV=production
# Root, because it programs iptables (the DaemonSet grants only NET_ADMIN); health 10256, metrics 10249.
USER root
EXPOSE 10256
ENTRYPOINT ["node", "--disable-sigusr1", "/usr/local/lib/node_modules/kube-userspace-proxy/bin/kube-userspace-proxy.js"]
