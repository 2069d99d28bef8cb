/**
 * initdata annotations: Kata's encoding (gzip, then base64, of a TOML document) decoded with
 * node's real zlib, every refusal coded and naming the annotation, and the bindings (SNP
 * HOST_DATA, TDX MRCONFIGID, vTPM PCR 8) computed by Kata's cut-or-pad rule.
 */
import { createHash } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import {
  INITDATA_DOCUMENT_MAX_BYTES,
  initdataFromAnnotations,
  initdataLaunch,
  KATA_INITDATA_ANNOTATION,
  KATA_TS_INITDATA_ANNOTATION,
  parseInitdataAnnotation,
  snpHostData,
  tdxMrConfigId,
  vtpmPcr8,
} from '../../../src/measure/initdata.js';
import { thrown } from '../../helpers/kata-error.js';

/** A document shaped like the ones Kata's docs show (attestation agent, CDH config, a policy). */
const DOC = `version = "0.1.0"
algorithm = "sha384"

[data]
"aa.toml" = '''
[token_configs]
[token_configs.kbs]
url = "http://kbs.example:8080"
'''

"cdh.toml" = '''
socket = 'unix:///run/confidential-containers/cdh.sock'
[kbc]
name = "cc_kbc"
url = "http://kbs.example:8080"
'''

"policy.rego" = '''
package agent_policy
default AllowRequestsFailingPolicy := false
'''
`;

const encode = (text: string | Buffer): string => gzipSync(Buffer.from(text)).toString('base64');
const sha = (alg: string, s: string | Buffer): Buffer => createHash(alg).update(s).digest();

describe('parseInitdataAnnotation', () => {
  it('decodes a Kata-style document and hashes its exact bytes', () => {
    const d = parseInitdataAnnotation(encode(DOC));
    expect(d.document.toString()).toBe(DOC);
    expect(d.version).toBe('0.1.0');
    expect(d.algorithm).toBe('sha384');
    expect(Object.keys(d.data)).toEqual(['aa.toml', 'cdh.toml', 'policy.rego']);
    expect(d.data['policy.rego']).toContain('package agent_policy');
    expect(d.digest).toEqual(sha('sha384', DOC));
    expect(d.digests.sha256).toEqual(sha('sha256', DOC));
    expect(d.digests.sha512).toEqual(sha('sha512', DOC));
  });

  it('ignores whitespace in the value, as Kata does (YAML-wrapped values)', () => {
    const b64 = encode(DOC);
    const wrapped = b64.replace(/(.{60})/g, '$1\n  ');
    expect(parseInitdataAnnotation(wrapped).document.toString()).toBe(DOC);
  });

  const cases: Array<[string, string, RegExp]> = [
    ['empty', '', /value is empty/],
    ['not base64', 'This is not base64!', /not standard, padded base64/],
    ['unpadded base64', encode(DOC).replace(/=+$/, ''), /padded base64/],
    ['base64 of text', Buffer.from('plain text, no gzip').toString('base64'), /not a gzip stream/],
    ['not UTF-8', encode(Buffer.from([0x76, 0xff, 0xfe])), /not UTF-8/],
    ['not TOML', encode('version = \n[data'), /not TOML/],
    ['no version', encode('algorithm = "sha256"\n[data]\n'), /no string "version"/],
    ['unknown version', encode('version = "0.2.0"\nalgorithm = "sha256"\n[data]\n'), /version "0.2.0" is not supported/],
    ['no algorithm', encode('version = "0.1.0"\n[data]\n'), /no string "algorithm"/],
    ['unknown algorithm', encode('version = "0.1.0"\nalgorithm = "md5"\n[data]\n'), /algorithm "md5" is not one of sha256, sha384, sha512/],
    ['no data', encode('version = "0.1.0"\nalgorithm = "sha256"\n'), /no \[data\] table/],
    ['data not strings', encode('version = "0.1.0"\nalgorithm = "sha256"\n[data]\nn = 3\n'), /data."n" is not a string/],
  ];
  for (const [name, value, message] of cases) {
    it(`refuses ${name}, naming the annotation`, () => {
      const err = thrown(() => parseInitdataAnnotation(value, KATA_TS_INITDATA_ANNOTATION));
      expect(err.reason).toBe('MEASURE_INITDATA_INVALID');
      expect(err.message).toMatch(/^annotation io\.kata-ts\.initdata: /);
      expect(err.message).toMatch(message);
      expect(err.details).toEqual({ field: 'annotations["io.kata-ts.initdata"]' });
    });
  }

  it('refuses a document over the limit once decompressed, without inflating it whole', () => {
    // 16 MiB of spaces compresses to a few KiB: a small annotation, a large document.
    const bomb = gzipSync(Buffer.alloc(16 * INITDATA_DOCUMENT_MAX_BYTES, 0x20)).toString('base64');
    expect(bomb.length).toBeLessThan(64 * 1024);
    const err = thrown(() => parseInitdataAnnotation(bomb));
    expect(err.reason).toBe('MEASURE_INITDATA_INVALID');
    expect(err.message).toMatch(/cc_init_data: the document is larger than 1048576 bytes/);
  });

  it('refuses an annotation value over 256 KiB before decoding it', () => {
    const err = thrown(() => parseInitdataAnnotation('A'.repeat(256 * 1024 + 4)));
    expect(err.message).toMatch(/262148 characters, more than the 262144 allowed/);
  });
});

describe('initdataFromAnnotations', () => {
  it('is null without either annotation', () => {
    expect(initdataFromAnnotations({ other: 'x' })).toBeNull();
    expect(initdataFromAnnotations(undefined)).toBeNull();
  });
  it("reads kata-ts's own annotation", () => {
    expect(initdataFromAnnotations({ [KATA_TS_INITDATA_ANNOTATION]: encode(DOC) })?.annotation).toBe(KATA_TS_INITDATA_ANNOTATION);
  });
  it('accepts both when they carry the same document (differently compressed)', () => {
    const other = gzipSync(Buffer.from(DOC), { level: 1 }).toString('base64');
    const d = initdataFromAnnotations({ [KATA_INITDATA_ANNOTATION]: encode(DOC), [KATA_TS_INITDATA_ANNOTATION]: other });
    expect(d?.annotation).toBe(KATA_INITDATA_ANNOTATION);
  });
  it('refuses two different documents', () => {
    const err = thrown(() =>
      initdataFromAnnotations({ [KATA_INITDATA_ANNOTATION]: encode(DOC), [KATA_TS_INITDATA_ANNOTATION]: encode(`${DOC}\n`) }),
    );
    expect(err.reason).toBe('MEASURE_INITDATA_INVALID');
    expect(err.message).toMatch(/io\.kata-ts\.initdata: carries a different document than annotation io\.katacontainers/);
  });
});

describe('bindings', () => {
  const withAlg = (alg: string): string => DOC.replace('algorithm = "sha384"', `algorithm = "${alg}"`);

  it('sha384: HOST_DATA is its first 32 bytes, MRCONFIGID all 48', () => {
    const d = parseInitdataAnnotation(encode(DOC));
    expect(snpHostData(d)).toEqual(sha('sha384', DOC).subarray(0, 32));
    expect(tdxMrConfigId(d)).toEqual(sha('sha384', DOC));
  });
  it('sha256: HOST_DATA is the digest, MRCONFIGID the digest and 16 zero bytes', () => {
    const doc = withAlg('sha256');
    const d = parseInitdataAnnotation(encode(doc));
    expect(snpHostData(d)).toEqual(sha('sha256', doc));
    expect(tdxMrConfigId(d)).toEqual(Buffer.concat([sha('sha256', doc), Buffer.alloc(16)]));
  });
  it('sha512: both cut', () => {
    const doc = withAlg('sha512');
    const d = parseInitdataAnnotation(encode(doc));
    expect(snpHostData(d)).toEqual(sha('sha512', doc).subarray(0, 32));
    expect(tdxMrConfigId(d)).toEqual(sha('sha512', doc).subarray(0, 48));
  });
  it('vtpm PCR 8 is one extend of sha256(document) from zeros, whatever the algorithm', () => {
    const d = parseInitdataAnnotation(encode(DOC));
    const expected = sha('sha256', Buffer.concat([Buffer.alloc(32), sha('sha256', DOC)]));
    expect(vtpmPcr8(d)).toEqual({ pcr: 8, digestSha256: sha('sha256', DOC), value: expected });
  });
  it('one changed byte changes every binding', () => {
    const a = parseInitdataAnnotation(encode(DOC));
    const b = parseInitdataAnnotation(encode(DOC.replace('8080', '8081')));
    expect(snpHostData(a)).not.toEqual(snpHostData(b));
    expect(tdxMrConfigId(a)).not.toEqual(tdxMrConfigId(b));
    expect(vtpmPcr8(a).value).not.toEqual(vtpmPcr8(b).value);
  });
  it('initdataLaunch gives each TEE its binding only, and refuses a handler without a TEE', () => {
    const d = parseInitdataAnnotation(encode(DOC));
    expect(Object.keys(initdataLaunch(d, 'vtpm', 'kata-ts-cvm')).sort()).toEqual(['document', 'pcr8']);
    expect(initdataLaunch(d, 'snp', 'kata-ts-cvm').snpHostData).toEqual(snpHostData(d));
    expect(initdataLaunch(d, 'tdx', 'kata-ts-cvm').tdxMrConfigId).toEqual(tdxMrConfigId(d));
    const err = thrown(() => initdataLaunch(d, 'none', 'kata-ts'));
    expect(err.reason).toBe('MEASURE_INITDATA_NO_TEE');
    expect(err.message).toMatch(/^annotation io\.katacontainers\.config\.hypervisor\.cc_init_data: handler "kata-ts" has no TEE/);
  });
});
