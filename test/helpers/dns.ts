// DNS messages for tests: a standard A query and its NOERROR answer.

/** A query (RD set) for `name`, type A. */
export function dnsQuery(id: number, name: string): Buffer {
  const labels = name.split('.').map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l)]));
  return Buffer.concat([
    Buffer.from([id >> 8, id & 0xff, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]),
    ...labels,
    Buffer.from([0, 0, 1, 0, 1]),
  ]);
}

/** The query turned into a NOERROR answer with one A record. */
export function dnsAnswer(query: Buffer): Buffer {
  const out = Buffer.concat([query, Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 10, 96, 0, 10])]);
  out[2] = 0x81;
  out[3] = 0x80;
  out.writeUInt16BE(1, 6);
  return out;
}
