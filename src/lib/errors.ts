// Every error code of the proxy. Callers branch on `code`, never on message text.
// Each code is documented in docs/errors.md (a test checks this).

export const ERROR_CODES = [
  'KUP_ERR_INVALID_FLAG',
  'KUP_ERR_CONFIG_FILE',
  'KUP_ERR_PORT_RANGE_INVALID',
  'KUP_ERR_PORT_RANGE_EXHAUSTED',
  'KUP_ERR_LISTEN',
  'KUP_ERR_MANIFEST_INVALID',
  'KUP_ERR_MANIFEST_READ',
  'KUP_ERR_INVALID_OBJECT',
  'KUP_ERR_IPTABLES_RESTORE',
  'KUP_ERR_IPTABLES_MISSING',
  'KUP_ERR_IPTABLES_SAVE',
  'KUP_ERR_CONNTRACK',
  'KUP_ERR_PORT_CONFLICT',
  'KUP_ERR_SHUTDOWN_TIMEOUT',
  'KUP_ERR_PERMISSION',
  'KUP_ERR_STATE_FILE_LOCKED',
  'KUP_ERR_API_REQUEST',
  'KUP_ERR_API_RESPONSE',
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

export class ProxyError extends Error {
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'ProxyError';
    this.code = code;
  }
}

export function isProxyError(err: unknown, code?: ErrorCode): err is ProxyError {
  return err instanceof ProxyError && (code === undefined || err.code === code);
}
