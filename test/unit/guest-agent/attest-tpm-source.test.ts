/**
 * The parts of the attester's TPM evidence that do not need a TPM (guest/agent/attest/
 * tpm-source.ts, tpm-ops.ts): reading the firmware event log whose size securityfs does not tell
 * (bounded, absent = empty), and the EK certificate's DER as PEM. The evidence itself, from a
 * real swtpm to a real broker, is test/integration/attest/attester.test.ts.
 */
import { X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { derToPem } from '../../../guest/agent/attest/tpm-ops.js';
import { readEventLog } from '../../../guest/agent/attest/tpm-source.js';
import { packageRoot } from '../../../src/common/paths.js';
import { rejection } from '../../helpers/kata-error.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'attest-tpm-source-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('the firmware event log', () => {
  it('is read whole across chunks, an absent one is null, a longer one than the cap is refused', async () => {
    const file = path.join(dir, 'log');
    const bytes = Buffer.alloc(200 * 1024);
    for (let i = 0; i < bytes.length; i++) bytes[i] = i % 251;
    writeFileSync(file, bytes);
    expect((await readEventLog(file))?.equals(bytes)).toBe(true);
    expect(await readEventLog(path.join(dir, 'absent'))).toBeNull();
    const e = await rejection(readEventLog(file, 100 * 1024));
    expect(e.reason).toBe('ATTEST_EVIDENCE_FAILED');
    expect(e.message).toContain(file);
  });
});

describe('the EK certificate as PEM', () => {
  it('wraps the DER in 64-character base64 lines that parse back to the same certificate', () => {
    const pem = readFileSync(path.join(packageRoot(), 'test/fixtures/attest/tdx/intel-sgx-root-ca.pem'), 'utf8');
    const der = new X509Certificate(pem).raw;
    const out = derToPem(der);
    expect(out.startsWith('-----BEGIN CERTIFICATE-----\n')).toBe(true);
    expect(out.split('\n').every((l) => l.length <= 64)).toBe(true);
    expect(new X509Certificate(out).raw.equals(der)).toBe(true);
  });
});
