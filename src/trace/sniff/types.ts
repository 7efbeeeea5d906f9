// The shapes shared by the protocol sniffers: what the first bytes of a connection told us, the per-request
// events for a live trace stream, and the Sniffer contract the relay drives. Types only.

export type AppProtocol = 'http1' | 'h2c' | 'tls' | 'dns' | 'postgres' | 'mysql' | 'redis' | 'unknown';

/** One HTTP/1.x request and, once seen, its response. Times are the caller's `nowMs` clock. */
export type HttpExchange = {
  /** Request ordinal on this connection, from 0. */
  readonly index: number;
  readonly method: string;
  /** Request target without query string or fragment (they may carry tokens), at most 1024 characters. */
  readonly path: string;
  /** `HTTP/1.1`, `HTTP/1.0`. */
  readonly version: string;
  /** Host header value (at most 255 characters); the only header value ever kept. */
  readonly host: string | undefined;
  /** When the first byte of the request line arrived. */
  readonly startMs: number;
  /** Final (non-1xx) status, or 101 for a switch of protocols. */
  readonly status: number | undefined;
  /** First response byte (an interim 100 counts) minus `startMs`. */
  readonly ttfbMs: number | undefined;
  /** Last byte of the response minus `startMs`; undefined while open or when the body runs to close. */
  readonly durationMs: number | undefined;
};

export type Http1Info = {
  readonly protocol: 'http1';
  /** The first `maxRequests` exchanges. */
  readonly exchanges: readonly HttpExchange[];
  /** Request heads seen, recorded or not. */
  readonly requests: number;
  /** Final response heads seen. */
  readonly responses: number;
  /** Upgrade token after a 101 (`websocket`, `h2c`), or `connect` after a 2xx to CONNECT. */
  readonly upgrade: string | undefined;
  /** A line passed the 8 KiB cap or the pipeline passed 256 requests: sniffing stopped there. */
  readonly truncated: boolean;
  /** Bytes that are not HTTP/1.x where HTTP was expected: sniffing stopped there. */
  readonly malformed: boolean;
};

export type H2cInfo = { readonly protocol: 'h2c' };

export type TlsInfo = {
  readonly protocol: 'tls';
  /** server_name (host_name) from the ClientHello. */
  readonly sni: string | undefined;
  /** ALPN protocols offered by the client, in order. */
  readonly alpn: readonly string[];
  /** ClientHello legacy_version (`TLS1.2` for every TLS 1.3 client). */
  readonly legacyVersion: string | undefined;
  /** supported_versions offered, GREASE removed. */
  readonly supportedVersions: readonly string[];
  /** The whole ClientHello was parsed (false: fields above come from the part that arrived). */
  readonly complete: boolean;
  /** ClientHello larger than 16 KiB: given up (Envoy's client_hello_too_large). */
  readonly tooLarge: boolean;
  /** The client's or server's first bytes were not a well-formed hello. */
  readonly malformed: boolean;
  /** Version chosen by the ServerHello (supported_versions, else legacy_version). */
  readonly selectedVersion: string | undefined;
  /** ALPN chosen by the ServerHello (TLS 1.2 only: TLS 1.3 sends it encrypted). */
  readonly selectedAlpn: string | undefined;
  /** Alert description code when the server answered the hello with an alert. */
  readonly alert: number | undefined;
};

/** One DNS query and, once seen, the response with the same ID. */
export type DnsExchange = {
  readonly id: number;
  /** First question's name without the trailing dot (`.` for the root); odd bytes as `\DDD`. */
  readonly qname: string | undefined;
  /** `A`, `AAAA`, `SRV`, ... or `TYPE<n>`. */
  readonly qtype: string | undefined;
  readonly startMs: number;
  /** `NOERROR`, `NXDOMAIN`, ... or `RCODE<n>`. */
  readonly rcode: string | undefined;
  readonly answers: number | undefined;
  /** The response had TC set (the client will retry over TCP). */
  readonly truncated: boolean | undefined;
  readonly latencyMs: number | undefined;
};

export type DnsInfo = {
  readonly protocol: 'dns';
  readonly transport: 'udp' | 'tcp';
  /** The first `maxRequests` queries. */
  readonly exchanges: readonly DnsExchange[];
  readonly queries: number;
  readonly responses: number;
  /** Responses whose ID matched no outstanding query. */
  readonly unmatched: number;
  /** Messages too short or with a bad question. */
  readonly malformed: number;
};

export type PostgresInfo = {
  readonly protocol: 'postgres';
  /** `3.0` (or `3.2`) from the StartupMessage. */
  readonly protocolVersion: string | undefined;
  readonly user: string | undefined;
  readonly database: string | undefined;
  readonly applicationName: string | undefined;
  readonly sslRequested: boolean;
  readonly gssEncRequested: boolean;
  /** Server's answer to SSLRequest/GSSENCRequest: `S`/`G` (encryption follows) or `N`. */
  readonly encryptionResponse: 'S' | 'G' | 'N' | undefined;
  readonly cancelRequest: boolean;
  /** The server's first answer to the StartupMessage: `ok`, `cleartext`, `md5`, `sasl`, ..., or `error`. */
  readonly auth: string | undefined;
  /** The TLS handshake after an accepted SSLRequest. */
  readonly tls: TlsInfo | undefined;
  /** The StartupMessage was longer than 10000 bytes or malformed. */
  readonly malformed: boolean;
};

export type MysqlInfo = {
  readonly protocol: 'mysql';
  readonly serverVersion: string | undefined;
  readonly connectionId: number | undefined;
  /** Server's default auth plugin, e.g. `caching_sha2_password`. */
  readonly authPlugin: string | undefined;
  readonly user: string | undefined;
  readonly database: string | undefined;
  /** The client asked for TLS (CLIENT_SSL SSLRequest packet). */
  readonly ssl: boolean;
  /** Server's first answer to the HandshakeResponse: `ok`, `error`, `auth-switch`, `auth-more-data`. */
  readonly authResult: string | undefined;
  /** The TLS handshake after an SSLRequest. */
  readonly tls: TlsInfo | undefined;
  readonly malformed: boolean;
};

export type RedisInfo = {
  readonly protocol: 'redis';
  /** Upper-cased names of the first `maxRequests` commands; arguments are never kept. */
  readonly commands: readonly string[];
  /** Commands seen, recorded or not. */
  readonly commandCount: number;
  /** An AUTH command, or a HELLO with its AUTH argument, was sent. */
  readonly auth: boolean;
  /** Inline (telnet-style) commands rather than RESP arrays. */
  readonly inline: boolean;
  readonly malformed: boolean;
};

export type UnknownInfo = {
  readonly protocol: 'unknown';
  /** `no-data`: nothing arrived; `incomplete`: too few bytes to decide; `unrecognized`: no signature matched. */
  readonly reason: 'no-data' | 'incomplete' | 'unrecognized';
};

/** What a sniffer learnt about one connection (TCP) or session (UDP). Plain data: JSON-serialisable. */
export type AppInfo =
  | Http1Info
  | H2cInfo
  | TlsInfo
  | DnsInfo
  | PostgresInfo
  | MysqlInfo
  | RedisInfo
  | UnknownInfo;

/** Per-request events, emitted synchronously from onClientData/onEndpointData as the bytes go by. */
export type SniffEvent =
  | {
      readonly type: 'http-request';
      readonly index: number;
      readonly method: string;
      readonly path: string;
      readonly version: string;
      readonly host: string | undefined;
      readonly atMs: number;
    }
  | {
      readonly type: 'http-response';
      readonly index: number;
      readonly method: string;
      readonly path: string;
      readonly host: string | undefined;
      readonly status: number;
      readonly ttfbMs: number;
      readonly atMs: number;
    }
  | {
      readonly type: 'dns-query';
      readonly id: number;
      readonly qname: string | undefined;
      readonly qtype: string | undefined;
      readonly atMs: number;
    }
  | {
      readonly type: 'dns-response';
      readonly id: number;
      readonly qname: string | undefined;
      readonly qtype: string | undefined;
      readonly rcode: string;
      readonly answers: number;
      /** Undefined when no outstanding query had this ID. */
      readonly latencyMs: number | undefined;
      readonly atMs: number;
    }
  | {
      readonly type: 'redis-command';
      readonly index: number;
      readonly command: string;
      readonly atMs: number;
    };

/** Receives SniffEvents. Called on the relay's data path: it must be cheap and must not throw. */
export type SniffEventSink = (event: SniffEvent) => void;

/**
 * Watches the bytes of one connection without delaying or changing them. The relay hands each chunk
 * over synchronously just after writing it on; the sniffer never keeps a reference to a chunk past
 * the call, so the relay may reuse its read buffer. Never throws on any input; memory is bounded.
 */
export interface Sniffer {
  /** Bytes (TCP) or one datagram (UDP) from the client towards the endpoint. */
  onClientData(buf: Buffer, nowMs: number): void;
  /** Bytes (TCP) or one datagram (UDP) from the endpoint back to the client. */
  onEndpointData(buf: Buffer, nowMs: number): void;
  /** True once it wants no more bytes: the relay stops calling it, so the steady-state cost is nothing. */
  readonly done: boolean;
  /** A fresh snapshot of what is known so far (also after done). */
  info(): AppInfo;
  /**
   * The connection closed: no byte will come. Lets go of what only the parse needed; true when what
   * info() returns from now on never changes, so that the closed record keeps the sniffer and reads its
   * info when asked, instead of a copy made at close (absent or false: the copy).
   */
  end?(): boolean;
}

/** Limits every per-protocol sniffer takes from createSniffer. */
export type SniffLimits = {
  /** Requests (HTTP exchanges, DNS queries, Redis commands) recorded in info(). */
  readonly maxRequests: number;
  /** Keep parsing after maxRequests to count (and emit events for) the rest, instead of becoming done. */
  readonly keepCounting: boolean;
  readonly onEvent: SniffEventSink | undefined;
};
