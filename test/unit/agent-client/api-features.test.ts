/**
 * The agent API negotiation (current version and one back) and the table of what the older one
 * lacks: the rules on their own, the table against agent.proto's `// since API N` lines and against
 * git history (everything the proto gained since the previous version's last commit is marked),
 * and the refusal through the real channel with a guest that answers Hello with the older version.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import protobuf from 'protobufjs';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { AgentService } from '../../../guest/agent/server.js';
import {
  AGENT_API_FEATURES,
  AGENT_API_MIN_VERSION,
  type AgentApiFeature,
  API_BASELINES,
  checkApiFeatures,
  missingFeatures,
  negotiateApiVersion,
} from '../../../src/agent-client/api-features.js';
import { codec } from '../../../src/agent-client/connection.js';
import { AgentClient } from '../../../src/agent-client/index.js';
import { type ServerHandlers, serveDuplex, serveRpc } from '../../../src/channel/index.js';
import { silentLogger } from '../../../src/common/logger.js';
import { AGENT_API_VERSION, AGENT_METHODS, type AgentMethods } from '../../../src/generated/agent/agent.js';
import { FakeContainerBackend } from './fake-backend.js';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const PROTO = path.join(repo, 'proto/agent/agent.proto');

describe('negotiateApiVersion', () => {
  it('accepts the current API and the one before, as the agent speaks it', () => {
    expect(negotiateApiVersion(AGENT_API_VERSION)).toBe(AGENT_API_VERSION);
    expect(negotiateApiVersion(AGENT_API_VERSION - 1)).toBe(AGENT_API_VERSION - 1);
    expect(AGENT_API_MIN_VERSION).toBe(AGENT_API_VERSION - 1);
    expect(negotiateApiVersion(4, 5)).toBe(4);
  });

  it.each([AGENT_API_VERSION - 2, AGENT_API_VERSION + 1, 0, 99])('refuses API %i naming both versions', (v) => {
    let err: unknown;
    try {
      negotiateApiVersion(v);
    } catch (e) {
      err = e;
    }
    expect(err).toMatchObject({ kind: 'unavailable', reason: 'AGENT_API_MISMATCH' });
    const message = (err as Error).message;
    expect(message).toContain(`the agent speaks API ${v};`);
    expect(message).toContain(`this daemon speaks API ${AGENT_API_VERSION} and also ${AGENT_API_VERSION - 1}`);
  });
});

describe('checkApiFeatures', () => {
  it('refuses secrets to an API 2 agent, naming the feature and the version, and lets an empty list through', () => {
    const call = () => checkApiFeatures(2, 'CreateContainer', { containerId: 'c', secrets: [{ resource: 'a/b/c', containerPath: '/s' }] });
    expect(call).toThrow(
      expect.objectContaining({
        kind: 'precondition',
        reason: 'AGENT_API_FEATURE_MISSING',
        details: expect.objectContaining({ feature: 'secrets' }),
      }),
    );
    expect(call).toThrow(/^the pod's agent speaks API 2, which has no secrets \(CreateContainer's field secrets, added in API 3\)/);
    expect(() => checkApiFeatures(2, 'CreateContainer', { containerId: 'c', secrets: [] })).not.toThrow();
    expect(() => checkApiFeatures(2, 'CreateContainer', { containerId: 'c' })).not.toThrow();
    expect(() =>
      checkApiFeatures(3, 'CreateContainer', { containerId: 'c', secrets: [{ resource: 'a/b/c', containerPath: '/s' }] }),
    ).not.toThrow();
  });

  it('refuses an rpc added since, whatever its request, and judges scalar fields by their protobuf default', () => {
    const table: AgentApiFeature[] = [
      { feature: 'quotes', since: 4, method: 'GetTpmQuote' },
      { feature: 'forced deletes', since: 4, method: 'DeleteContainer', field: 'force' },
    ];
    expect(() => checkApiFeatures(3, 'GetTpmQuote', undefined, table)).toThrow(
      /API 3, which has no quotes \(the rpc GetTpmQuote, added in API 4\)/,
    );
    expect(() => checkApiFeatures(4, 'GetTpmQuote', undefined, table)).not.toThrow();
    expect(() => checkApiFeatures(3, 'DeleteContainer', { containerId: 'c', force: false }, table)).not.toThrow();
    expect(() => checkApiFeatures(3, 'DeleteContainer', { containerId: 'c', force: true }, table)).toThrow(/no forced deletes/);
    expect(missingFeatures(3, table).map((f) => f.feature)).toEqual(['quotes', 'forced deletes']);
    expect(missingFeatures(AGENT_API_VERSION)).toEqual([]);
  });
});

/** What agent.proto marks `// since API N`: rpcs by name, fields by the rpc whose request holds them. */
function protoMarkers(text: string): Array<{ method: string; field?: string; since: number }> {
  const requestOf = new Map<string, string[]>();
  for (const m of text.matchAll(/^\s*rpc (\w+)\((?:stream )?(\w+)\)/gm)) requestOf.set(m[2]!, [...(requestOf.get(m[2]!) ?? []), m[1]!]);
  const out: Array<{ method: string; field?: string; since: number }> = [];
  let message: string | undefined;
  let pending: number | undefined;
  for (const line of text.split('\n')) {
    const open = /^message (\w+) \{/.exec(line);
    if (open) message = open[1];
    if (/^\}/.test(line)) message = undefined;
    const marker = /^\s*\/\/ since API (\d+)\s*$/.exec(line);
    if (marker) {
      pending = Number(marker[1]);
      continue;
    }
    if (/^\s*\/\//.test(line) || pending === undefined) continue;
    const rpc = /^\s*rpc (\w+)\(/.exec(line);
    const field = /^\s*(?:repeated |optional )?[\w.]+ (\w+) = \d+;/.exec(line);
    if (rpc) out.push({ method: rpc[1]!, since: pending });
    else if (field && message !== undefined) {
      const camel = field[1]!.replace(/_(\w)/g, (_, c: string) => c.toUpperCase());
      const methods = requestOf.get(message);
      if (methods === undefined)
        throw new Error(`agent.proto: "since API" marks field ${field[1]} of ${message}, which no rpc takes as its request`);
      for (const method of methods) out.push({ method, field: camel, since: pending });
    } else throw new Error(`agent.proto: a "since API" line is followed by neither an rpc nor a field: ${line}`);
    pending = undefined;
  }
  return out;
}

describe('the feature table against agent.proto', () => {
  it('lists exactly what the proto marks "since API N", each no newer than the current version', () => {
    const markers = protoMarkers(readFileSync(PROTO, 'utf8'));
    const table = AGENT_API_FEATURES.map((f) => ({
      method: f.method,
      ...(f.field === undefined ? {} : { field: f.field }),
      since: f.since,
    }));
    const key = (e: { method: string; field?: string; since: number }) => `${e.method}.${e.field ?? '*'}@${e.since}`;
    expect(table.map(key).sort()).toEqual(markers.map(key).sort());
    expect(markers.length).toBeGreaterThan(0);
    for (const f of AGENT_API_FEATURES) expect(f.since).toBeLessThanOrEqual(AGENT_API_VERSION);
  });

  // A fresh clone has the history; a shallow one may lack the baseline commit (then say so).
  const baseline = API_BASELINES[AGENT_API_MIN_VERSION];
  const haveBaseline = (() => {
    try {
      execFileSync('git', ['-C', repo, 'cat-file', '-e', `${baseline}:proto/agent/agent.proto`], { stdio: 'ignore' });
      return true;
    } catch {
      console.warn(
        `api-features: git history without ${baseline} (a shallow clone?): the proto is not compared with API ${AGENT_API_MIN_VERSION}'s`,
      );
      return false;
    }
  })();

  it('names a baseline commit for the previous API', () => {
    expect(baseline).toMatch(/^[0-9a-f]{40}$/);
  });

  it.skipIf(!haveBaseline)('marks everything the proto gained since the previous API (rpcs, fields of existing messages)', () => {
    const oldText = execFileSync('git', ['-C', repo, 'show', `${baseline}:proto/agent/agent.proto`], { encoding: 'utf8' });
    expect(/^\/\/ api_version: (\d+)$/m.exec(oldText)?.[1]).toBe(String(AGENT_API_MIN_VERSION));
    const text = readFileSync(PROTO, 'utf8');
    const parse = (t: string) => protobuf.parse(t, { keepCase: true }).root.lookupService('katats.agent.v1.Agent');
    const oldService = parse(oldText);
    const newService = parse(text);
    const marked = new Set(protoMarkers(text).map((m) => `${m.method}.${m.field ?? '*'}`));
    const unmarked: string[] = [];
    for (const method of newService.methodsArray) {
      const before = oldService.methods[method.name];
      if (before === undefined) {
        if (!marked.has(`${method.name}.*`)) unmarked.push(`rpc ${method.name}`);
        continue;
      }
      const oldType = oldService.root.lookupType(`katats.agent.v1.${before.requestType}`);
      const newType = newService.root.lookupType(`katats.agent.v1.${method.requestType}`);
      for (const field of newType.fieldsArray) {
        if (oldType.fieldsById[field.id] !== undefined) continue;
        const camel = field.name.replace(/_(\w)/g, (_, c: string) => c.toUpperCase());
        if (!marked.has(`${method.name}.${camel}`)) unmarked.push(`${method.requestType}.${field.name}`);
      }
    }
    expect(unmarked).toEqual([]);
    // The one addition this version was bumped for.
    expect(marked.has('CreateContainer.secrets')).toBe(true);
  });
});

describe('an agent one API back, over the real channel', () => {
  let dir: string;
  let server: net.Server;
  let sockets: Set<net.Socket>;
  let created: string[];
  const clients: AgentClient[] = [];

  /** The real AgentService, answering Hello with `apiVersion` and noting each CreateContainer it receives. */
  async function startGuest(apiVersion: number): Promise<string> {
    const service = new AgentService({ backend: new FakeContainerBackend(), agentVersion: 'old', logger: silentLogger() });
    const handlers = service.handlers();
    const patched: ServerHandlers<AgentMethods> = {
      ...handlers,
      Hello: async (req, ctx) => ({ ...(await handlers.Hello(req, ctx)), apiVersion }),
      CreateContainer: async (req, ctx) => {
        created.push(req.containerId);
        return handlers.CreateContainer(req, ctx);
      },
    };
    const socketPath = path.join(dir, `agent-${apiVersion}.sock`);
    server = net.createServer((socket) => {
      sockets.add(socket);
      serveDuplex(socket, (session) => serveRpc(session, AGENT_METHODS, patched, codec));
    });
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
    return socketPath;
  }

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'kts-apifeat-'));
    sockets = new Set();
    created = [];
  });

  afterEach(async () => {
    for (const c of clients.splice(0)) c.close();
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    rmSync(dir, { recursive: true, force: true });
  });

  it('connects at the older API, refuses secrets before sending them, and serves everything else', async () => {
    const older = AGENT_API_VERSION - 1;
    const socketPath = await startGuest(older);
    const client = await AgentClient.connect({ socketPath, logger: silentLogger(), hostVersion: 'test', minBackoffMs: 20 }, 5000);
    clients.push(client);
    expect(client.connection.apiVersion).toBe(older);
    const err = await client
      .createContainer(
        { containerId: 'with-secrets', secrets: [{ resource: 'default/db/password', containerPath: '/run/secrets/p' }] },
        { timeoutMs: 5000 },
      )
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ kind: 'precondition', reason: 'AGENT_API_FEATURE_MISSING' });
    expect((err as Error).message).toContain(`speaks API ${older}, which has no secrets`);
    // Nothing reached the agent: it would have created the container without its files.
    expect(created).toEqual([]);
    await client.createContainer({ containerId: 'plain' }, { timeoutMs: 5000 });
    expect(created).toEqual(['plain']);
    expect((await client.listContainers([], { timeoutMs: 5000 })).map((c) => c.containerId)).toEqual(['plain']);
  });

  it('gives up on an agent two versions back with AGENT_API_MISMATCH naming both', async () => {
    const socketPath = await startGuest(AGENT_API_VERSION - 2);
    const err = await AgentClient.connect({ socketPath, logger: silentLogger(), hostVersion: 'test', minBackoffMs: 20 }, 300).catch(
      (e: unknown) => e,
    );
    expect((err as Error).cause).toMatchObject({ reason: 'AGENT_API_MISMATCH' });
    expect(((err as Error).cause as Error).message).toContain(
      `the agent speaks API ${AGENT_API_VERSION - 2}; this daemon speaks API ${AGENT_API_VERSION}`,
    );
    expect(created).toEqual([]);
  });
});
