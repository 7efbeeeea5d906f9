import assert from 'node:assert/strict';
import { test } from 'node:test';
import tls from 'node:tls';
import { createSniffer } from '../../../src/trace/sniff/classify.ts';
import { MysqlSniffer } from '../../../src/trace/sniff/mysql.ts';
import { PostgresSniffer } from '../../../src/trace/sniff/postgres.ts';
import { RedisSniffer } from '../../../src/trace/sniff/redis.ts';
import type { MysqlInfo, PostgresInfo, RedisInfo, SniffEvent } from '../../../src/trace/sniff/types.ts';
import {
  assertSplitInvariant,
  bytewise,
  captureClientBytes,
  mutate,
  prng,
  randomBytes,
  randomChunks,
  replay,
  type Step,
  truncated,
} from '../../helpers/sniff.ts';

const SECRET = 'SECRET-PASSWORD-91c2';
const eq = (g: unknown, w: unknown, how: string) => assert.deepStrictEqual(g, w, how);
const client = (bytes: Buffer): Step => ({ from: 'client', bytes });
const server = (bytes: Buffer): Step => ({ from: 'server', bytes });

function assertNoSecret(...values: unknown[]): void {
  const text = JSON.stringify(values);
  assert.ok(!text.includes('SECRET'), text);
}

function int32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0);
  return b;
}

// --- PostgreSQL: messages as in "Message Formats" of the protocol documentation (chapter 55.7) ---

/** StartupMessage: Int32 length, Int32 196608 (3.0), name/value C strings, a final NUL. */
function pgStartup(params: Record<string, string>, code = 196608): Buffer {
  const body = Buffer.concat([
    int32(code),
    ...Object.entries(params).map(([k, v]) => Buffer.from(`${k}\0${v}\0`)),
    Buffer.from([0]),
  ]);
  return Buffer.concat([int32(body.length + 4), body]);
}
const pgSslRequest = () => Buffer.concat([int32(8), int32(80877103)]);
const pgGssEncRequest = () => Buffer.concat([int32(8), int32(80877104)]);
const pgCancel = () => Buffer.concat([int32(16), int32(80877102), int32(4242), int32(0x5ec2e7)]);
/** Backend message: type byte, Int32 length (including itself), body. */
const pgMessage = (type: string, body: Buffer) =>
  Buffer.concat([Buffer.from(type), int32(body.length + 4), body]);
const pgAuthSasl = () => pgMessage('R', Buffer.concat([int32(10), Buffer.from('SCRAM-SHA-256\0\0')]));
/** PasswordMessage: what a client sends after AuthenticationCleartextPassword. */
const pgPassword = () => pgMessage('p', Buffer.from(`${SECRET}\0`));

const pg = (info: unknown): PostgresInfo => {
  assert.equal((info as PostgresInfo).protocol, 'postgres');
  return info as PostgresInfo;
};

async function realClientHello(servername: string): Promise<Buffer> {
  return captureClientBytes(
    (port) => {
      const sock = tls.connect({ host: '127.0.0.1', port, servername });
      sock.on('error', () => {});
      return sock;
    },
    (got) => got.length >= 5 && got.length >= 5 + got.readUInt16BE(3),
  );
}

test('postgres StartupMessage: user, database, application_name, auth method; the password is never read', () => {
  const steps = [
    client(
      pgStartup({ user: 'alice', database: 'orders', application_name: 'psql', options: `-c x=${SECRET}` }),
    ),
    server(pgMessage('R', int32(3))), // AuthenticationCleartextPassword
    client(pgPassword()),
  ];
  const info = pg(assertSplitInvariant(() => createSniffer({ protocol: 'tcp' }), steps, eq));
  assert.deepEqual(
    [info.protocolVersion, info.user, info.database, info.applicationName, info.auth, info.sslRequested],
    ['3.0', 'alice', 'orders', 'psql', 'cleartext', false],
  );
  assertNoSecret(info);
  const sn = createSniffer({ protocol: 'tcp' });
  replay(sn, steps.slice(0, 2));
  assert.equal(sn.done, true, 'done after the server answered the startup');

  // Truncated: a value cut short is not reported at all (it would be a wrong value).
  const startup = steps[0]!.bytes;
  const cutInUser = pg(replay(createSniffer({ protocol: 'tcp' }), [client(startup.subarray(0, 15))]));
  assert.equal(cutInUser.user, undefined);
  const cutAfterUser = pg(replay(createSniffer({ protocol: 'tcp' }), [client(startup.subarray(0, 22))]));
  assert.deepEqual([cutAfterUser.user, cutAfterUser.database], ['alice', undefined]);
});

test('postgres SSLRequest: S then the TLS hello is read (SNI), N then a plain startup; GSSENC and cancel', async () => {
  const hello = await realClientHello('pg.example.test');
  const ssl = pg(
    assertSplitInvariant(
      () => createSniffer({ protocol: 'tcp' }),
      [client(pgSslRequest()), server(Buffer.from('S')), client(hello)],
      eq,
    ),
  );
  assert.deepEqual([ssl.sslRequested, ssl.encryptionResponse, ssl.tls?.sni], [true, 'S', 'pg.example.test']);

  const plain = pg(
    replay(
      createSniffer({ protocol: 'tcp' }),
      [
        client(pgSslRequest()),
        server(Buffer.from('N')),
        client(pgStartup({ user: 'bob' })),
        server(pgAuthSasl()),
      ],
      bytewise,
    ),
  );
  assert.deepEqual(
    [plain.encryptionResponse, plain.user, plain.auth, plain.tls],
    ['N', 'bob', 'sasl', undefined],
  );

  const gss = createSniffer({ protocol: 'tcp' });
  const g = pg(replay(gss, [client(pgGssEncRequest()), server(Buffer.from('G'))]));
  assert.deepEqual([g.gssEncRequested, g.encryptionResponse, gss.done], [true, 'G', true]);

  const cancel = createSniffer({ protocol: 'tcp' });
  assert.equal(pg(replay(cancel, [client(pgCancel())])).cancelRequest, true);
  assert.equal(cancel.done, true);
});

// --- MySQL: packets as in the client/server protocol documentation (Connection Phase) ---

/** Packet: 3-byte little-endian payload length, sequence id, payload. */
function myPacket(seq: number, payload: Buffer): Buffer {
  const h = Buffer.from([payload.length & 0xff, (payload.length >> 8) & 0xff, payload.length >> 16, seq]);
  return Buffer.concat([h, payload]);
}

/** Protocol::HandshakeV10 of a MySQL 8 server. */
function myGreeting(): Buffer {
  const caps = 0xdfffffff & ~0x800; // a MySQL 8 capability set, without CLIENT_SSL (no certificate)
  const p = Buffer.concat([
    Buffer.from([0x0a]),
    Buffer.from('8.0.36-debug\0'),
    Buffer.from([0x2a, 0, 0, 0]), // connection id 42
    Buffer.from('abcdefgh'), // auth-plugin-data-part-1 (scramble)
    Buffer.from([0]),
    Buffer.from([caps & 0xff, (caps >> 8) & 0xff]),
    Buffer.from([0xff, 0x02, 0x00]), // charset, status
    Buffer.from([(caps >> 16) & 0xff, (caps >> 24) & 0xff]),
    Buffer.from([21]),
    Buffer.alloc(10),
    Buffer.from('ijklmnopqrst\0'), // auth-plugin-data-part-2
    Buffer.from('caching_sha2_password\0'),
  ]);
  return myPacket(0, p);
}

const CLIENT = {
  CONNECT_WITH_DB: 0x8,
  PROTOCOL_41: 0x200,
  SSL: 0x800,
  SECURE_CONNECTION: 0x8000,
  PLUGIN_AUTH: 0x80000,
  LENENC: 0x200000,
};

function myCaps(extra: number): Buffer {
  const b = Buffer.alloc(32);
  b.writeUInt32LE(CLIENT.PROTOCOL_41 | CLIENT.SECURE_CONNECTION | CLIENT.PLUGIN_AUTH | extra, 0);
  b.writeUInt32LE(16 * 1024 * 1024, 4);
  b[8] = 0xff;
  return b;
}

/** Protocol::HandshakeResponse41 with a lenenc auth response, a database and the plugin name. */
function myLogin(user: string, database: string | undefined): Buffer {
  const auth = Buffer.from(SECRET);
  return myPacket(
    1,
    Buffer.concat([
      myCaps(CLIENT.LENENC | (database ? CLIENT.CONNECT_WITH_DB : 0)),
      Buffer.from(`${user}\0`),
      Buffer.from([auth.length]),
      auth,
      Buffer.from(database ? `${database}\0` : ''),
      Buffer.from('caching_sha2_password\0'),
    ]),
  );
}

const my = (info: unknown): MysqlInfo => {
  assert.equal((info as MysqlInfo).protocol, 'mysql');
  return info as MysqlInfo;
};

test('mysql: the server greets first (version, plugin); the login gives user and database, never the auth', () => {
  const steps = [
    server(myGreeting()),
    client(myLogin('app_user', 'inventory')),
    server(myPacket(2, Buffer.from([0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00]))), // OK
  ];
  const info = my(assertSplitInvariant(() => createSniffer({ protocol: 'tcp' }), steps, eq));
  assert.deepEqual(
    [
      info.serverVersion,
      info.connectionId,
      info.authPlugin,
      info.user,
      info.database,
      info.ssl,
      info.authResult,
    ],
    ['8.0.36-debug', 42, 'caching_sha2_password', 'app_user', 'inventory', false, 'ok'],
  );
  assertNoSecret(info);
  const sn = createSniffer({ protocol: 'tcp' });
  replay(sn, steps);
  assert.equal(sn.done, true);

  const denied = my(
    replay(new MysqlSniffer(), [
      server(myGreeting()),
      client(myLogin('root', undefined)),
      server(
        myPacket(2, Buffer.concat([Buffer.from([0xff, 0x15, 0x04]), Buffer.from('#28000Access denied')])),
      ),
    ]),
  );
  assert.deepEqual([denied.user, denied.database, denied.authResult], ['root', undefined, 'error']);
  for (let cut = 0; cut < 200; cut++)
    assertNoSecret(replay(createSniffer({ protocol: 'tcp' }), truncated(steps, cut)));
});

test('mysql SSLRequest: ssl flag, then the TLS hello that follows is read', async () => {
  const hello = await realClientHello('mysql.example.test');
  const info = my(
    assertSplitInvariant(
      () => createSniffer({ protocol: 'tcp' }),
      [server(myGreeting()), client(Buffer.concat([myPacket(1, myCaps(CLIENT.SSL)), hello]))],
      eq,
    ),
  );
  assert.deepEqual([info.ssl, info.user, info.tls?.sni], [true, undefined, 'mysql.example.test']);
});

// --- Redis: RESP arrays of bulk strings, and inline commands ---

function resp(...args: string[]): Buffer {
  return Buffer.from(
    `*${args.length}\r\n` + args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join(''),
  );
}

const redis = (info: unknown): RedisInfo => {
  assert.equal((info as RedisInfo).protocol, 'redis');
  return info as RedisInfo;
};

test('redis RESP: command names in order, AUTH noticed, arguments never kept', () => {
  const events: SniffEvent[] = [];
  const steps = [
    client(
      Buffer.concat([
        resp('AUTH', 'default', SECRET),
        resp('hello', '3', 'AUTH', 'u', SECRET),
        resp('SET', 'SECRET-key', 'x'.repeat(5000)),
        resp('get', 'SECRET-key'),
      ]),
    ),
    server(Buffer.from('+OK\r\n')),
  ];
  const info = redis(assertSplitInvariant(() => createSniffer({ protocol: 'tcp' }), steps, eq));
  assert.deepEqual(
    [info.commands, info.commandCount, info.auth, info.inline],
    [['AUTH', 'HELLO', 'SET', 'GET'], 4, true, false],
  );
  replay(createSniffer({ protocol: 'tcp', onEvent: (e) => events.push(e) }), steps);
  assert.deepEqual(
    events.map((e) => (e.type === 'redis-command' ? e.command : e.type)),
    ['AUTH', 'HELLO', 'SET', 'GET'],
  );
  assertNoSecret(info, events);
});

test('redis inline commands, and the bound on recorded commands', () => {
  const inline = redis(
    replay(
      createSniffer({ protocol: 'tcp' }),
      [client(Buffer.from(`PING\r\nauth ${SECRET}\r\nINFO server\n`))],
      bytewise,
    ),
  );
  assert.deepEqual([inline.commands, inline.inline, inline.auth], [['PING', 'AUTH', 'INFO'], true, true]);
  assertNoSecret(inline);

  const many = Buffer.concat(Array.from({ length: 40 }, (_, i) => resp('INCR', `k${i}`)));
  const bounded = new RedisSniffer({ maxRequests: 16, keepCounting: false, onEvent: undefined });
  bounded.onClientData(many, 1);
  assert.deepEqual(
    [bounded.done, redis(bounded.info()).commands.length, redis(bounded.info()).commandCount],
    [true, 16, 16],
  );
  const counting = new RedisSniffer({ maxRequests: 16, keepCounting: true, onEvent: undefined });
  counting.onClientData(many, 1);
  assert.deepEqual(
    [counting.done, redis(counting.info()).commands.length, redis(counting.info()).commandCount],
    [false, 16, 40],
  );

  const broken = new RedisSniffer({ maxRequests: 16, keepCounting: false, onEvent: undefined });
  broken.onClientData(Buffer.from('*2\r\n$3\r\nGET\r\n:5\r\n'), 1);
  assert.deepEqual(
    [redis(broken.info()).malformed, broken.done, redis(broken.info()).commands],
    [true, true, ['GET']],
  );
});

test('redis auth: AUTH, or HELLO with its AUTH argument (RESP or inline); a bare HELLO is not auth', () => {
  const cases: { name: string; bytes: Buffer; commands: string[]; auth: boolean }[] = [
    { name: 'HELLO 3', bytes: resp('HELLO', '3'), commands: ['HELLO'], auth: false },
    { name: 'HELLO alone', bytes: resp('hello'), commands: ['HELLO'], auth: false },
    {
      name: 'HELLO 3 SETNAME auth',
      bytes: resp('HELLO', '3', 'SETNAME', 'auth1'),
      commands: ['HELLO'],
      auth: false,
    },
    {
      name: 'HELLO 3 AUTH u p',
      bytes: resp('HELLO', '3', 'AUTH', 'u', SECRET),
      commands: ['HELLO'],
      auth: true,
    },
    {
      name: 'HELLO 3 auth (lower case)',
      bytes: resp('HELLO', '3', 'auth', 'u', SECRET),
      commands: ['HELLO'],
      auth: true,
    },
    { name: 'GET AUTH is a key', bytes: resp('GET', 'AUTH'), commands: ['GET'], auth: false },
    { name: 'AUTH', bytes: resp('AUTH', SECRET), commands: ['AUTH'], auth: true },
    {
      name: 'inline PING then HELLO 3',
      bytes: Buffer.from('PING\r\nHELLO 3\r\n'),
      commands: ['PING', 'HELLO'],
      auth: false,
    },
    {
      name: 'inline PING then HELLO 3 AUTH',
      bytes: Buffer.from(`PING\r\nhello 3 AUTH default ${SECRET}\r\nGET k\r\n`),
      commands: ['PING', 'HELLO', 'GET'],
      auth: true,
    },
    {
      name: 'inline HELLO with AUTHX is not AUTH',
      bytes: Buffer.from('PING\r\nHELLO 3 AUTHX u p\r\n'),
      commands: ['PING', 'HELLO'],
      auth: false,
    },
  ];
  for (const c of cases) {
    for (const split of [(b: Buffer) => [b], bytewise]) {
      const info = redis(replay(createSniffer({ protocol: 'tcp' }), [client(c.bytes)], split));
      assert.deepEqual([info.commands, info.auth], [c.commands, c.auth], c.name);
      assertNoSecret(info);
    }
  }
});

test('fuzz: mutated Postgres, MySQL and Redis messages and random bytes never throw', async () => {
  const hello = await realClientHello('fuzz.test');
  const rand = prng(0xdb);
  const pgSteps = [client(pgStartup({ user: 'alice', database: 'db' })), server(pgAuthSasl())];
  const mySteps = [server(myGreeting()), client(myLogin('u', 'd')), server(myPacket(2, Buffer.from([0])))];
  const redisBytes = Buffer.concat([resp('AUTH', SECRET), resp('SET', 'a', 'b')]);
  const deadline = Date.now() + 5000;
  for (let i = 0; i < 2000 && Date.now() < deadline; i++) {
    const pick = i % 4;
    const sn =
      pick === 0
        ? new PostgresSniffer()
        : pick === 1
          ? new MysqlSniffer()
          : pick === 2
            ? new RedisSniffer({ maxRequests: 16, keepCounting: false, onEvent: undefined })
            : createSniffer({ protocol: 'tcp' });
    const steps: Step[] =
      pick === 0
        ? [...pgSteps.map((s) => ({ from: s.from, bytes: mutate(rand, s.bytes) })), client(hello)]
        : pick === 1
          ? mySteps.map((s) => ({ from: s.from, bytes: mutate(rand, s.bytes) }))
          : pick === 2
            ? [client(mutate(rand, redisBytes))]
            : [client(randomBytes(rand, 64)), server(randomBytes(rand, 64))];
    for (const s of steps) {
      for (const part of randomChunks(rand, s.bytes)) {
        if (s.from === 'client') sn.onClientData(part, i);
        else sn.onEndpointData(part, i);
      }
    }
    assert.doesNotThrow(() => JSON.stringify(sn.info()));
  }
});
