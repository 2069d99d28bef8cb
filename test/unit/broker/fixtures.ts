/**
 * Shared fixtures of the broker's unit tests: reference documents, a memory decision sink, a
 * settable clock, and FAKE verifiers (no TEE evidence exists here that the broker's own tests
 * could make; the real tpm verifier is src/attest/tpm-verifier.ts, tested by its owner).
 */
import { createHash } from 'node:crypto';
import type { AttestFailure, EvidenceVerifier, VerifiedTee } from '../../../src/attest/verifier.js';
import type { Decision, DecisionSink } from '../../../src/broker/decisions.js';
import { invalid } from '../../../src/common/errors.js';
import { REFERENCE_VALUES_SCHEMA, type ReferenceValues } from '../../../src/measure/reference-values.js';

export const hex = (c: string) => c.repeat(64);

export function vtpmReference(pcrs: Record<string, string>, initdataSha256?: string, name = 'pod'): ReferenceValues {
  return {
    schema: REFERENCE_VALUES_SCHEMA,
    pod: { name, namespace: 'lab', uid: `uid-${name}` },
    handler: 'kata-ts-cvm',
    tee: 'vtpm',
    inputs: {
      kernelSha256: hex('a'),
      initrdSha256: hex('b'),
      cmdline: 'console=ttyS0',
      ramBelow4GiBBytes: 1 << 30,
      ...(initdataSha256 === undefined ? {} : { initdataSha256 }),
    },
    vtpm: { bank: 'sha256', pcrs, events: [], notPredicted: [] },
  };
}

export function snpReference(launch: string): ReferenceValues {
  return {
    schema: REFERENCE_VALUES_SCHEMA,
    pod: { name: 'snp', namespace: 'lab', uid: 'uid-snp' },
    handler: 'kata-ts-snp',
    tee: 'snp',
    inputs: { kernelSha256: hex('a'), initrdSha256: hex('b'), cmdline: '', ramBelow4GiBBytes: 1 << 30 },
    snp: { snp_launch_measurement: launch, host_data: hex('0') },
  };
}

export class MemorySink implements DecisionSink {
  readonly lines: Decision[] = [];
  record(decision: Decision): void {
    // Through JSON, as the file gets it: what is not serialisable would show here.
    this.lines.push(JSON.parse(JSON.stringify(decision)) as Decision);
  }
  last(event: string): Decision | undefined {
    return [...this.lines].reverse().find((d) => d.event === event);
  }
}

export class Clock {
  constructor(public t = 1_800_000_000_000) {}
  now = (): number => this.t;
  advance(ms: number): void {
    this.t += ms;
  }
}

/**
 * FAKE evidence for tee "tpm": `{ measurements: {claim: hex}, bound: hex sha256(runtimeDataBytes),
 * initdata?: hex sha256(init-data body) }`. It checks the binding and the initdata digest the way a
 * real verifier must, so the broker's handling of both is exercised; it checks no signature.
 */
export function fakeTpmVerifier(tee: VerifiedTee = 'tpm'): EvidenceVerifier & { challenges: unknown[] } {
  const challenges: unknown[] = [];
  return {
    tee,
    challenges,
    challenge(extra, nonce) {
      if (typeof extra !== 'object' || extra === null || Array.isArray(extra))
        throw invalid('ATTEST_MESSAGE_INVALID', 'Request /extra-params must be an object for the fake tpm verifier');
      challenges.push(extra);
      return { extraParams: { fake: true }, sessionState: { nonce } };
    },
    verify(input) {
      const ev = input.evidence as { measurements?: Record<string, string>; bound?: string; throwBug?: boolean };
      if (ev.throwBug === true) throw new Error('a bug in the verifier');
      const failures: AttestFailure[] = [];
      const bound = createHash('sha256').update(input.runtimeDataBytes).digest('hex');
      if (ev.bound !== bound)
        failures.push({
          field: 'report_data',
          reason: 'evidence is not bound to the runtime data',
          expected: bound,
          actual: String(ev.bound),
        });
      if ((input.sessionState as { nonce: string }).nonce !== input.nonce) failures.push({ field: 'nonce', reason: 'session state lost' });
      if (failures.length > 0) return { ok: false, failures };
      const measurements = { ...(ev.measurements ?? {}) };
      if (input.initdataBody !== null) measurements.init_data = createHash('sha256').update(input.initdataBody).digest('hex');
      return { ok: true, claims: { tee, measurements, details: { verifier: 'fake' } } };
    },
  };
}
