/**
 * A KBS client for the benches: one RCAR round (auth, attest, one resource) over HTTPS against a
 * `kata-ts broker serve`, with stand-in evidence from test/helpers/tpm-evidence-tool.ts (a real
 * swtpm and the guest's own TPM code). Every answer is checked; a refused round throws.
 */

import type { KeyObject } from 'node:crypto';
import https from 'node:https';
import { decryptResource } from '../../src/attest/jwe.js';
import { type TpmEvidenceTool, teeRuntimeData } from '../../test/helpers/tpm-evidence-tool.js';

export interface KbsTarget {
  host: string;
  port: number;
  /** The broker's certificate (PEM), the only CA trusted. */
  certPem: string;
}

interface Answer {
  status: number;
  cookie: string | null;
  body: string;
}

function request(t: KbsTarget, agent: https.Agent, method: string, target: string, body?: string, cookie?: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = {};
    if (body !== undefined) headers['content-type'] = 'application/json';
    if (cookie !== undefined) headers.cookie = cookie;
    const req = https.request({ host: t.host, port: t.port, method, path: target, ca: t.certPem, headers, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const set = res.headers['set-cookie']?.[0];
        resolve({
          status: res.statusCode ?? 0,
          cookie: set === undefined ? null : (set.split(';')[0] ?? null),
          body: Buffer.concat(chunks).toString(),
        });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** One attestation and one resource: returns the resource's plaintext (the round's key opens it). */
export async function kbsRound(
  t: KbsTarget,
  agent: https.Agent,
  tool: TpmEvidenceTool,
  initdata: string,
  resourcePath: string,
): Promise<Buffer> {
  const auth = await request(
    t,
    agent,
    'POST',
    '/kbs/v0/auth',
    JSON.stringify({ version: '0.4.0', tee: 'tpm', 'extra-params': tool.requestExtraParams() }),
  );
  if (auth.status !== 200 || auth.cookie === null) throw new Error(`auth answered ${auth.status}: ${auth.body}`);
  const challenge = JSON.parse(auth.body) as { nonce: string; 'extra-params': unknown };
  const rd = teeRuntimeData(challenge.nonce);
  const evidence = await tool.evidence(challenge['extra-params'], rd.bytes);
  const attest = await request(
    t,
    agent,
    'POST',
    '/kbs/v0/attest',
    JSON.stringify({
      'init-data': { format: 'toml', body: initdata },
      'runtime-data': rd.runtimeData,
      'tee-evidence': { primary_evidence: evidence, additional_evidence: '' },
    }),
    auth.cookie,
  );
  if (attest.status !== 200) throw new Error(`attest answered ${attest.status}: ${attest.body}`);
  const res = await request(t, agent, 'GET', `/kbs/v0/resource/${resourcePath}`, undefined, auth.cookie);
  if (res.status !== 200) throw new Error(`resource answered ${res.status}: ${res.body}`);
  return Buffer.from(await decryptResource(JSON.parse(res.body) as Record<string, string>, rd.privateKey as KeyObject));
}
