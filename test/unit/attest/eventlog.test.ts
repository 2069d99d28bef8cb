/**
 * The TCG2 crypto-agile event log parser and replay (src/attest/eventlog.ts) against tpm2-tools'
 * vectors (test/fixtures/attest/eventlog: real firmware logs and what tpm2_eventlog prints for
 * them): the same events (PCR, type name) and, per bank, the same replayed PCRs. Then malformed
 * logs: every length lie, cap and inconsistency is refused with ATTEST_EVENT_LOG_INVALID naming
 * where, never a read past the end.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  digestsOf,
  EVENT_LOG_LIMITS,
  encodeEventLog,
  eventTypeName,
  extendedPcrs,
  parseEventLog,
  pcrResetValue,
  replayEventLog,
} from '../../../src/attest/eventlog.js';
import { thrown } from '../../helpers/kata-error.js';

const DIR = path.join(import.meta.dirname, '..', '..', 'fixtures', 'attest', 'eventlog');
const read = (f: string): Buffer => readFileSync(path.join(DIR, f));

/** tpm2_eventlog's output: the events' PCR and type, and the replayed PCRs per bank. */
function expected(file: string): { events: Array<{ pcr: number; type: string }>; pcrs: Record<string, Record<number, string>> } {
  const text = readFileSync(path.join(DIR, file), 'utf8');
  const events = [...text.matchAll(/^- EventNum: (\d+)\n {2}PCRIndex: (\d+)\n {2}EventType: (\w+)$/gm)].map((m) => ({
    pcr: Number(m[2]),
    type: m[3] as string,
  }));
  const pcrs: Record<string, Record<number, string>> = {};
  let bank = '';
  for (const line of text.slice(text.indexOf('\npcrs:')).split('\n').slice(2)) {
    const b = /^ {2}(\w+):$/.exec(line);
    if (b !== null) {
      bank = b[1] as string;
      pcrs[bank] = {};
      continue;
    }
    const p = /^ {4}(\d+)\s*: 0x([0-9a-f]+)$/.exec(line);
    if (p !== null) (pcrs[bank] as Record<number, string>)[Number(p[1])] = p[2] as string;
  }
  return { events, pcrs };
}

const VECTORS: Array<[string, string]> = [
  ['event-arch-linux.bin', 'event-arch-linux.bin.yaml'],
  ['event-bootorder.bin', 'event-bootorder.bin.yaml'],
  ['event-gce-ubuntu-2104-log.bin', 'event-gce-ubuntu-2104-log.bin.yaml'],
  ['event-moklisttrusted.bin', 'event-moklisttrusted.bin.yaml'],
  ['event-postcode.bin', 'event-postcode.bin.yaml'],
  ['event-sd-boot-fedora37.bin', 'event-sd-boot-fedora37.bin.yaml'],
  ['event-uefiaction.bin', 'event-uefiaction.bin.yaml'],
  ['event-uefiservices.bin', 'event-uefiservices.bin.yaml'],
  ['event-uefivar.bin', 'event-uefivar.bin.yaml'],
  ['event.bin', 'event.bin.yaml'],
];

describe('event log vectors (tpm2-tools)', () => {
  for (const [bin, yaml] of VECTORS) {
    it(`${bin}: events and replayed PCRs as tpm2_eventlog says`, () => {
      const log = parseEventLog(read(bin));
      const want = expected(yaml);
      // The header is event 0 in tpm2_eventlog's numbering and not in `events` here.
      expect(want.events[0]?.type).toBe('EV_NO_ACTION');
      expect(log.events.map((e) => ({ pcr: e.pcr, type: e.typeName }))).toEqual(want.events.slice(1));
      expect(Object.keys(want.pcrs).length).toBeGreaterThan(0);
      for (const [bank, values] of Object.entries(want.pcrs)) {
        const replayed = replayEventLog(log, bank as 'sha256');
        expect(Object.keys(values).length).toBeGreaterThan(0);
        for (const [pcr, hex] of Object.entries(values)) expect(replayed[Number(pcr)]?.toString('hex'), `${bank} PCR ${pcr}`).toBe(hex);
      }
      // The PCRs tpm2_eventlog lists are the ones the log extends.
      expect(extendedPcrs(log)).toEqual(Object.keys(Object.values(want.pcrs)[0] ?? {}).map(Number));
    });
  }

  it('a live OVMF direct boot (capture-ovmf-log.ts): the log plus the initdata extend replay to every PCR the guest read', () => {
    const meta = JSON.parse(read('ovmf-direct-boot.json').toString('utf8')) as { initdata: string; pcrs: Record<string, string> };
    const log = parseEventLog(read('ovmf-direct-boot.bin'));
    expect(log.events.map((e) => `${e.pcr}:${e.typeName}`)).toContain('4:EV_EFI_BOOT_SERVICES_APPLICATION');
    expect(log.events.filter((e) => e.pcr === 9).map((e) => e.typeName)).toEqual(['EV_EVENT_TAG', 'EV_EVENT_TAG']);
    const replayed = replayEventLog(log, 'sha256', [{ pcr: 8, digest: createHash('sha256').update(meta.initdata).digest() }]);
    expect(Object.keys(meta.pcrs).map(Number)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    for (const [pcr, hex] of Object.entries(meta.pcrs)) expect(replayed[Number(pcr)]?.toString('hex'), `PCR ${pcr}`).toBe(hex);
    // Without the agent's extend PCR 8 stays at reset, which the guest did not read.
    expect(replayEventLog(log)[8]?.toString('hex')).not.toBe(meta.pcrs['8']);
  });

  it('event.bin: four banks named by the Spec ID event', () => {
    const log = parseEventLog(read('event.bin'));
    expect(log.specId.algorithms.map((a) => [a.name, a.digestBytes])).toEqual([
      ['sha1', 20],
      ['sha256', 32],
      ['sha384', 48],
      ['sha512', 64],
    ]);
    expect(log.specId.specVersion).toEqual({ major: 2, minor: 0, errata: 0 });
  });

  it('a log with a StartupLocality event starts PCR 0 at the locality', () => {
    const withLocality = VECTORS.map(([bin]) => parseEventLog(read(bin))).filter((l) => l.startupLocality !== null);
    // Whether any vector has one is a fact of the vectors; the synthetic case below always runs.
    for (const l of withLocality) expect(replayEventLog(l)[0]).toBeDefined();
    const banks = ['sha256'] as const;
    const locality = Buffer.concat([Buffer.from('StartupLocality\0', 'latin1'), Buffer.from([3])]);
    const sep = Buffer.alloc(4);
    const log = parseEventLog(
      encodeEventLog(banks, [
        { pcr: 0, type: 3, digests: { sha256: Buffer.alloc(32) }, data: locality },
        { pcr: 0, type: 4, digests: digestsOf(banks, sep), data: sep },
      ]),
    );
    expect(log.startupLocality).toBe(3);
    const start = Buffer.alloc(32);
    start[31] = 3;
    expect(replayEventLog(log)[0]).toEqual(createHash('sha256').update(start).update(createHash('sha256').update(sep).digest()).digest());
  });

  it('refuses a SHA-1-only log: not crypto-agile', () => {
    const err = thrown(() => parseEventLog(read('event-uefi-sha1-log.bin')));
    expect(err.reason).toBe('ATTEST_EVENT_LOG_INVALID');
    expect(err.message).toMatch(/not crypto-agile/);
    expect(err.details?.field).toBe('event_log');
  });

  it('refuses a Spec ID event whose vendor info lies past its declared size', () => {
    const err = thrown(() => parseEventLog(read('specid-vendordata.bin')));
    expect(err.reason).toBe('ATTEST_EVENT_LOG_INVALID');
    expect(err.message).toMatch(/vendorInfo/);
  });
});

describe('replay', () => {
  const banks = ['sha1', 'sha256'] as const;
  const sep = Buffer.alloc(4);
  const action = Buffer.from('Calling EFI Application from Boot Option');

  it('replays each bank, then the agent extends; untouched PCRs keep their reset values', () => {
    const log = parseEventLog(
      encodeEventLog(banks, [
        { pcr: 4, type: 0x80000007, digests: digestsOf(banks, action), data: action },
        { pcr: 4, type: 4, digests: digestsOf(banks, sep), data: sep },
        { pcr: 7, type: 4, digests: digestsOf(banks, sep), data: sep },
      ]),
    );
    expect(log.events.map((e) => e.typeName)).toEqual(['EV_EFI_ACTION', 'EV_SEPARATOR', 'EV_SEPARATOR']);
    const ext = (bank: string, pcr: Buffer, data: Buffer) =>
      createHash(bank).update(pcr).update(createHash(bank).update(data).digest()).digest();
    const initdata = createHash('sha256').update('doc').digest();
    const v = replayEventLog(log, 'sha256', [{ pcr: 8, digest: initdata }]);
    expect(v[4]).toEqual(ext('sha256', ext('sha256', Buffer.alloc(32), action), sep));
    expect(v[7]).toEqual(ext('sha256', Buffer.alloc(32), sep));
    expect(v[8]).toEqual(createHash('sha256').update(Buffer.alloc(32)).update(initdata).digest());
    expect(v[9]).toEqual(Buffer.alloc(32));
    expect(v[17]).toEqual(Buffer.alloc(32, 0xff));
    expect(Object.keys(v)).toHaveLength(24);
    const s1 = replayEventLog(log, 'sha1');
    expect(s1[4]).toEqual(ext('sha1', ext('sha1', Buffer.alloc(20), action), sep));
    expect(thrown(() => replayEventLog(log, 'sha384')).message).toMatch(/has no sha384 bank/);
    expect(thrown(() => replayEventLog(log, 'sha256', [{ pcr: 8, digest: Buffer.alloc(20) }])).message).toMatch(/20-byte digest/);
    expect(thrown(() => replayEventLog(log, 'sha256', [{ pcr: 24, digest: initdata }])).message).toMatch(/PCR 24/);
  });

  it('a bank an event leaves out cannot be replayed, naming the event', () => {
    const log = parseEventLog(encodeEventLog(banks, [{ pcr: 4, type: 4, digests: digestsOf(banks, sep), data: sep }]));
    const partial = { ...log, events: log.events.map((e) => ({ ...e, digests: { sha1: e.digests.sha1 as Buffer } })) };
    expect(replayEventLog(partial, 'sha1')[4]).toBeDefined();
    const err = thrown(() => replayEventLog(partial, 'sha256'));
    expect(err.message).toMatch(/event 1 \(PCR 4, EV_SEPARATOR\) has no sha256 digest/);
  });

  it('reset values: 17-22 all ones, the rest zero', () => {
    expect(pcrResetValue(16, 32)).toEqual(Buffer.alloc(32));
    expect(pcrResetValue(17, 32)).toEqual(Buffer.alloc(32, 0xff));
    expect(pcrResetValue(22, 20)).toEqual(Buffer.alloc(20, 0xff));
    expect(pcrResetValue(23, 32)).toEqual(Buffer.alloc(32));
    expect(pcrResetValue(0, 32, 4)[31]).toBe(4);
  });

  it('names event types, unknown ones by number', () => {
    expect(eventTypeName(0x80000003)).toBe('EV_EFI_BOOT_SERVICES_APPLICATION');
    expect(eventTypeName(0x800000e0)).toBe('EV_EFI_VARIABLE_AUTHORITY');
    expect(eventTypeName(0x1234)).toBe('EV_UNKNOWN_0x00001234');
  });
});

describe('malformed logs are refused, naming where', () => {
  const banks = ['sha256'] as const;
  const sep = Buffer.alloc(4);
  const good = encodeEventLog(banks, [
    { pcr: 0, type: 4, digests: digestsOf(banks, sep), data: sep },
    { pcr: 1, type: 4, digests: digestsOf(banks, sep), data: sep },
  ]);
  const HEADER = 32; // TCG_PCR_EVENT up to its event data
  const SPEC = 16 + 4 + 4 + 4 + 4 + 1; // one algorithm, no vendor info
  const FIRST = HEADER + SPEC; // the first TCG_PCR_EVENT2
  const EVENT = 4 + 4 + 4 + 2 + 32 + 4 + 4;

  const mutate = (f: (b: Buffer) => void): Buffer => {
    const b = Buffer.from(good);
    f(b);
    return b;
  };
  const refused = (log: Buffer, message: RegExp): void => {
    const err = thrown(() => parseEventLog(log));
    expect(err.reason).toBe('ATTEST_EVENT_LOG_INVALID');
    expect(err.details?.field).toBe('event_log');
    expect(err.message).toMatch(message);
  };

  it('the good log parses', () => {
    expect(parseEventLog(good).events).toHaveLength(2);
    expect(good.length).toBe(FIRST + 2 * EVENT);
  });

  it('empty, or larger than the cap', () => {
    refused(Buffer.alloc(0), /is empty/);
    refused(Buffer.concat([good, Buffer.alloc(EVENT_LOG_LIMITS.bytes)]), /more than the 1048576 accepted/);
  });

  it('truncated anywhere: never read past the end', () => {
    for (let n = 1; n < good.length; n++) {
      if (n === FIRST || n === FIRST + EVENT) continue; // ends between events: a shorter, valid log
      const err = thrown(() => parseEventLog(good.subarray(0, n)));
      expect(err.reason, `cut at ${n}`).toBe('ATTEST_EVENT_LOG_INVALID');
    }
    expect(parseEventLog(good.subarray(0, FIRST + EVENT)).events).toHaveLength(1);
  });

  it('a header that is not the Spec ID event', () => {
    refused(
      mutate((b) => b.writeUInt32LE(1, 0)),
      /not crypto-agile: it does not start with an EV_NO_ACTION header event of PCR 0/,
    );
    refused(
      mutate((b) => b.writeUInt32LE(4, 4)),
      /EV_NO_ACTION header event/,
    );
    refused(
      mutate((b) => {
        b[10] = 1;
      }),
      /zero digest/,
    );
    refused(
      mutate((b) => {
        b[HEADER + 14] = 0x32; // "Spec ID Event02"
      }),
      /not crypto-agile/,
    );
  });

  it('a Spec ID event that lies', () => {
    refused(
      mutate((b) => b.writeUInt32LE(0, HEADER + 24)),
      /names 0 algorithms/,
    );
    refused(
      mutate((b) => b.writeUInt32LE(9, HEADER + 24)),
      /names 9 algorithms/,
    );
    refused(
      mutate((b) => b.writeUInt16LE(20, HEADER + 30)),
      /sha256 a digest of 20 bytes/,
    );
    refused(
      mutate((b) => b.writeUInt32LE(SPEC + 1, 28)),
      /truncated|after its vendor info/,
    );
    refused(
      mutate((b) => b.writeUInt32LE(0xffffffff, 28)),
      /truncated in event 0: the Spec ID event needs 4294967295 bytes/,
    );
  });

  it('an event that lies', () => {
    refused(
      mutate((b) => b.writeUInt32LE(24, FIRST)),
      /event 1 names PCR 24/,
    );
    refused(
      mutate((b) => b.writeUInt32LE(2, FIRST + 8)),
      /event 1 carries 2 digests; the Spec ID event names 1/,
    );
    refused(
      mutate((b) => b.writeUInt32LE(0, FIRST + 8)),
      /event 1 carries 0 digests/,
    );
    refused(
      mutate((b) => b.writeUInt16LE(0x0004, FIRST + 12)),
      /algorithm 0x4, which the Spec ID event does not name/,
    );
    refused(
      mutate((b) => b.writeUInt32LE(0x7fffffff, FIRST + 46)),
      /truncated in event 1: the event data needs 2147483647 bytes/,
    );
    refused(Buffer.concat([good, Buffer.alloc(3)]), /truncated in event 3/);
    const twoLocalities = encodeEventLog(
      banks,
      [1, 2].map(() => ({
        pcr: 0,
        type: 3,
        digests: { sha256: Buffer.alloc(32) },
        data: Buffer.concat([Buffer.from('StartupLocality\0', 'latin1'), Buffer.from([0])]),
      })),
    );
    refused(twoLocalities, /second StartupLocality/);
    const badLocality = encodeEventLog(banks, [
      {
        pcr: 0,
        type: 3,
        digests: { sha256: Buffer.alloc(32) },
        data: Buffer.concat([Buffer.from('StartupLocality\0', 'latin1'), Buffer.from([7])]),
      },
    ]);
    refused(badLocality, /locality 7/);
  });

  it('more events than the cap', () => {
    const many = encodeEventLog(
      banks,
      Array.from({ length: EVENT_LOG_LIMITS.events + 1 }, () => ({
        pcr: 1,
        type: 4,
        digests: digestsOf(banks, sep),
        data: Buffer.alloc(0),
      })),
    );
    expect(many.length).toBeLessThan(EVENT_LOG_LIMITS.bytes);
    refused(many, /more than 20000 events/);
  });

  it('encodeEventLog refuses an event without a digest of every bank', () => {
    expect(
      thrown(() => encodeEventLog(['sha1', 'sha256'], [{ pcr: 0, type: 4, digests: digestsOf(['sha256'], sep), data: sep }])).message,
    ).toMatch(/lacks a 20-byte sha1 digest/);
  });
});
