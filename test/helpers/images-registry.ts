import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { createSign, randomBytes, X509Certificate } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import YAML from 'yaml';

const execFileAsync = promisify(execFile);

/** Debian's docker-registry (distribution 2.8), installed by the setup script. */
export const REGISTRY_BINARY = '/usr/bin/docker-registry';

export interface RegistryUser {
  username: string;
  password: string;
}

export type RegistryAuth =
  | { kind: 'none' }
  /** HTTP Basic against an htpasswd file (bcrypt hashes made by apache2-utils' htpasswd). */
  | { kind: 'htpasswd'; users: RegistryUser[] }
  /** Docker token auth: a token server in this process signs JWTs the registry verifies. */
  | { kind: 'token'; users: RegistryUser[]; anonymousPull?: boolean };

export interface RegistryHandle {
  /** `127.0.0.1:<port>` */
  host: string;
  url: string;
  dir: string;
  pid: number;
  auth: RegistryAuth;
  /** An Authorization header value good for pushing to `repository` (undefined without auth). */
  pushAuthorization(repository: string): Promise<string | undefined>;
  /** Requests the token server answered, for assertions about the auth dance. */
  tokenRequests: Array<{ scope: string; user: string | undefined }>;
  stop(): Promise<void>;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr !== null ? resolve(addr.port) : reject(new Error('no port'))));
    });
  });
}

async function htpasswdLine(user: RegistryUser): Promise<string> {
  // distribution only accepts bcrypt entries.
  const { stdout } = await execFileAsync('htpasswd', ['-nbB', user.username, user.password]);
  return stdout.trim();
}

function b64url(data: Buffer | string): string {
  return Buffer.from(data).toString('base64url');
}

interface TokenServer {
  realm: string;
  stop(): Promise<void>;
  sign(scope: string, user: string | undefined): string;
}

/**
 * A minimal Docker token server: checks Basic credentials (when given), grants pull/push on the
 * requested repository, and signs an RS256 JWT whose x5c header carries the certificate the
 * registry trusts (its `rootcertbundle`).
 */
async function startTokenServer(
  dir: string,
  users: RegistryUser[],
  anonymousPull: boolean,
  requests: RegistryHandle['tokenRequests'],
): Promise<TokenServer & { certFile: string }> {
  const keyFile = path.join(dir, 'token.key');
  const certFile = path.join(dir, 'token.crt');
  await execFileAsync('openssl', [
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-keyout',
    keyFile,
    '-out',
    certFile,
    '-days',
    '2',
    '-subj',
    '/CN=kata-ts test token issuer',
  ]);
  const key = readFileSync(keyFile, 'utf8');
  const certDer = new X509Certificate(readFileSync(certFile)).raw;
  const sign = (scope: string, user: string | undefined): string => {
    const access = [];
    const m = /^repository:([^:]+):(.+)$/.exec(scope);
    if (m !== null) access.push({ type: 'repository', name: m[1], actions: user === undefined ? ['pull'] : (m[2] ?? '').split(',') });
    const now = Math.floor(Date.now() / 1000);
    const header = { typ: 'JWT', alg: 'RS256', x5c: [certDer.toString('base64')] };
    const claims = {
      iss: 'kata-ts-test-issuer',
      sub: user ?? '',
      aud: 'kata-ts-test-registry',
      exp: now + 600,
      nbf: now - 60,
      iat: now,
      jti: randomBytes(8).toString('hex'),
      access,
    };
    const signingInput = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(claims))}`;
    const signature = createSign('RSA-SHA256').update(signingInput).sign(key);
    return `${signingInput}.${b64url(signature)}`;
  };
  const server = http.createServer((req, res) => {
    if (req.method === 'POST') {
      // OAuth2 refresh-token grant (docker's identity token): the token `refresh-<user>` is valid.
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        const form = new URLSearchParams(body);
        const scope = form.get('scope') ?? '';
        const name = (form.get('refresh_token') ?? '').replace(/^refresh-/, '');
        const known = form.get('grant_type') === 'refresh_token' && users.some((u) => u.username === name);
        requests.push({ scope, user: known ? `oauth:${name}` : 'refused:oauth' });
        if (!known) {
          res.writeHead(401, { 'Content-Type': 'application/json' }).end('{"error":"invalid_grant"}');
          return;
        }
        res
          .writeHead(200, { 'Content-Type': 'application/json' })
          .end(JSON.stringify({ access_token: sign(scope, name), expires_in: 600 }));
      });
      return;
    }
    const url = new URL(req.url ?? '/', 'http://x');
    const scope = url.searchParams.get('scope') ?? '';
    let user: string | undefined;
    const auth = req.headers.authorization;
    if (auth?.startsWith('Basic ') === true) {
      const [name, ...rest] = Buffer.from(auth.slice(6), 'base64').toString('utf8').split(':');
      const ok = users.some((u) => u.username === name && u.password === rest.join(':'));
      if (!ok) {
        requests.push({ scope, user: `refused:${name}` });
        res.writeHead(401, { 'Content-Type': 'application/json' }).end('{"details":"bad credentials"}');
        return;
      }
      user = name;
    } else if (!anonymousPull) {
      requests.push({ scope, user: undefined });
      res.writeHead(401, { 'Content-Type': 'application/json' }).end('{"details":"credentials required"}');
      return;
    }
    requests.push({ scope, user });
    res.writeHead(200, { 'Content-Type': 'application/json' }).end(JSON.stringify({ token: sign(scope, user), expires_in: 600 }));
  });
  const port = await freePort();
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  return {
    realm: `http://127.0.0.1:${port}/token`,
    certFile,
    sign,
    stop: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

async function waitUntilServing(url: string, child: ChildProcess, logFile: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`docker-registry exited ${child.exitCode}: ${await fsp.readFile(logFile, 'utf8')}`);
    try {
      const res = await fetch(`${url}/v2/`);
      await res.arrayBuffer();
      if (res.status === 200 || res.status === 401) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`docker-registry did not answer on ${url}/v2/ within 20 s: ${await fsp.readFile(logFile, 'utf8')}`);
}

/**
 * Start a real docker-registry on 127.0.0.1 with filesystem storage in a temp dir. Stop it with
 * `stop()` (SIGTERM, then SIGKILL by PID), which also removes the temp dir.
 */
export async function startRegistry(auth: RegistryAuth = { kind: 'none' }): Promise<RegistryHandle> {
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'kata-registry-'));
  const tokenRequests: RegistryHandle['tokenRequests'] = [];
  let token: (TokenServer & { certFile: string }) | undefined;
  let child: ChildProcess | undefined;
  try {
    const port = await freePort();
    const config: Record<string, unknown> = {
      version: 0.1,
      log: { level: 'warn', accesslog: { disabled: true } },
      storage: {
        filesystem: { rootdirectory: path.join(dir, 'data') },
        delete: { enabled: true },
        maintenance: { uploadpurging: { enabled: false } },
      },
      http: { addr: `127.0.0.1:${port}`, secret: randomBytes(16).toString('hex') },
    };
    if (auth.kind === 'htpasswd') {
      const file = path.join(dir, 'htpasswd');
      await fsp.writeFile(file, `${(await Promise.all(auth.users.map(htpasswdLine))).join('\n')}\n`);
      config.auth = { htpasswd: { realm: 'kata-ts-test', path: file } };
    } else if (auth.kind === 'token') {
      token = await startTokenServer(dir, auth.users, auth.anonymousPull ?? false, tokenRequests);
      config.auth = {
        token: { realm: token.realm, service: 'kata-ts-test-registry', issuer: 'kata-ts-test-issuer', rootcertbundle: token.certFile },
      };
    }
    const configFile = path.join(dir, 'config.yml');
    await fsp.writeFile(configFile, YAML.stringify(config));
    const logFile = path.join(dir, 'registry.log');
    const log = await fsp.open(logFile, 'w');
    child = spawn(REGISTRY_BINARY, ['serve', configFile], { stdio: ['ignore', log.fd, log.fd], detached: false });
    await log.close();
    const url = `http://127.0.0.1:${port}`;
    await waitUntilServing(url, child, logFile);
    const proc = child;
    const tokenServer = token;
    const pushUser = auth.kind === 'none' ? undefined : auth.users[0];
    return {
      host: `127.0.0.1:${port}`,
      url,
      dir,
      pid: proc.pid as number,
      auth,
      tokenRequests,
      pushAuthorization: async (repository) => {
        if (auth.kind === 'htpasswd' && pushUser !== undefined) {
          return `Basic ${Buffer.from(`${pushUser.username}:${pushUser.password}`).toString('base64')}`;
        }
        if (tokenServer !== undefined && pushUser !== undefined)
          return `Bearer ${tokenServer.sign(`repository:${repository}:pull,push`, pushUser.username)}`;
        return undefined;
      },
      stop: async () => {
        await stopChild(proc);
        await tokenServer?.stop();
        await fsp.rm(dir, { recursive: true, force: true });
      },
    };
  } catch (err) {
    if (child !== undefined) await stopChild(child);
    await token?.stop();
    await fsp.rm(dir, { recursive: true, force: true });
    throw err;
  }
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  if (child.pid !== undefined) process.kill(child.pid, 'SIGTERM');
  const timer = setTimeout(() => {
    if (child.pid !== undefined && child.exitCode === null) process.kill(child.pid, 'SIGKILL');
  }, 5_000);
  await exited;
  clearTimeout(timer);
}
