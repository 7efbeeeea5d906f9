// A PROXY protocol reader for test endpoints (HAProxy's proxy-protocol.txt, versions 1 and 2),
// written from the specification, independently of src/relay/proxy-protocol.ts: what a receiving
// server does with the first bytes of a connection.
import net from 'node:net';

export type ProxyHeader = {
  version: 1 | 2;
  /** `TCP4`/`TCP6`/`UNKNOWN` (v1); for v2 the family byte's meaning the same way. */
  family: 'TCP4' | 'TCP6' | 'UNKNOWN';
  source: string;
  sourcePort: number;
  destination: string;
  destinationPort: number;
};

const V2_SIG = Buffer.from('0d0a0d0a000d0a515549540a', 'hex');

/**
 * Reads one header at the start of `buf`: the header and how many bytes it took; `undefined` while more
 * bytes are needed; throws on anything the specification does not allow.
 */
export function parseProxyHeader(buf: Buffer): { header: ProxyHeader; length: number } | undefined {
  if (buf.length >= 12 && buf.subarray(0, 12).equals(V2_SIG)) return parseV2(buf);
  if (buf.length < 6) {
    if (!Buffer.from('PROXY ').subarray(0, buf.length).equals(buf)) throw new Error('no PROXY header');
    return undefined;
  }
  if (buf.subarray(0, 6).toString('latin1') !== 'PROXY ') {
    if (buf.length < 12 && V2_SIG.subarray(0, buf.length).equals(buf)) return undefined;
    throw new Error(`no PROXY header: ${JSON.stringify(buf.subarray(0, 16).toString('latin1'))}`);
  }
  const end = buf.indexOf('\r\n');
  if (end < 0) {
    if (buf.length > 107) throw new Error('v1 header longer than 107 bytes');
    return undefined;
  }
  if (end + 2 > 107) throw new Error('v1 header longer than 107 bytes');
  const parts = buf.subarray(0, end).toString('latin1').split(' ');
  if (parts[1] === 'UNKNOWN')
    return {
      header: {
        version: 1,
        family: 'UNKNOWN',
        source: '',
        sourcePort: 0,
        destination: '',
        destinationPort: 0,
      },
      length: end + 2,
    };
  if (parts.length !== 6) throw new Error(`v1 header of ${parts.length} fields`);
  const [, family, source, destination, sp, dp] = parts as [string, string, string, string, string, string];
  if (family !== 'TCP4' && family !== 'TCP6') throw new Error(`v1 family ${family}`);
  const want = family === 'TCP4' ? 4 : 6;
  if (net.isIP(source) !== want || net.isIP(destination) !== want)
    throw new Error('v1 address of the wrong family');
  for (const p of [sp, dp])
    if (!/^(0|[1-9]\d{0,4})$/.test(p) || Number(p) > 65535) throw new Error(`v1 port ${p}`);
  return {
    header: { version: 1, family, source, sourcePort: Number(sp), destination, destinationPort: Number(dp) },
    length: end + 2,
  };
}

function parseV2(buf: Buffer): { header: ProxyHeader; length: number } | undefined {
  if (buf.length < 16) return undefined;
  const verCmd = buf[12]!;
  if (verCmd >> 4 !== 2) throw new Error(`v2 version ${verCmd >> 4}`);
  const command = verCmd & 0x0f;
  if (command !== 0 && command !== 1) throw new Error(`v2 command ${command}`);
  const fam = buf[13]!;
  const len = buf.readUInt16BE(14);
  if (buf.length < 16 + len) return undefined;
  const body = buf.subarray(16, 16 + len);
  const unknown = {
    version: 2 as const,
    family: 'UNKNOWN' as const,
    source: '',
    sourcePort: 0,
    destination: '',
    destinationPort: 0,
  };
  if (command === 0 || fam === 0x00) return { header: unknown, length: 16 + len };
  if (fam === 0x11) {
    if (len < 12) throw new Error('v2 TCP4 body too short');
    return {
      header: {
        version: 2,
        family: 'TCP4',
        source: [...body.subarray(0, 4)].join('.'),
        destination: [...body.subarray(4, 8)].join('.'),
        sourcePort: body.readUInt16BE(8),
        destinationPort: body.readUInt16BE(10),
      },
      length: 16 + len,
    };
  }
  if (fam === 0x21) {
    if (len < 36) throw new Error('v2 TCP6 body too short');
    const ip6 = (b: Buffer) => {
      const words: string[] = [];
      for (let i = 0; i < 16; i += 2) words.push(b.readUInt16BE(i).toString(16));
      return new net.SocketAddress({ address: words.join(':'), family: 'ipv6' }).address;
    };
    return {
      header: {
        version: 2,
        family: 'TCP6',
        source: ip6(body.subarray(0, 16)),
        destination: ip6(body.subarray(16, 32)),
        sourcePort: body.readUInt16BE(32),
        destinationPort: body.readUInt16BE(34),
      },
      length: 16 + len,
    };
  }
  throw new Error(`v2 family/transport 0x${fam.toString(16)}`);
}

/**
 * A TCP server that expects a PROXY header first (or none, with `required: false`): each connection's
 * header (undefined when none came) and the bytes after it are recorded; it answers `reply`, then closes.
 */
export async function proxyProtocolServer(
  host: string,
  reply: (header: ProxyHeader | undefined, rest: Buffer) => string,
): Promise<{ server: net.Server; port: number; seen: { header: ProxyHeader | undefined; rest: string }[] }> {
  const seen: { header: ProxyHeader | undefined; rest: string }[] = [];
  const server = net.createServer((socket) => {
    let buf = Buffer.alloc(0);
    let done = false;
    socket.on('error', () => {});
    socket.on('data', (chunk) => {
      if (done) return;
      buf = Buffer.concat([buf, chunk]);
      let header: ProxyHeader | undefined;
      let rest = buf;
      try {
        const parsed = parseProxyHeader(buf);
        if (parsed === undefined) return;
        header = parsed.header;
        rest = buf.subarray(parsed.length);
      } catch {
        header = undefined;
      }
      // Requests in these tests end with a newline.
      if (!rest.includes(0x0a)) return;
      done = true;
      seen.push({ header, rest: rest.toString('latin1') });
      socket.end(reply(header, rest));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  return { server, port: (server.address() as net.AddressInfo).port, seen };
}
