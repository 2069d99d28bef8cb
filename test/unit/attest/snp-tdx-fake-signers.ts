/**
 * FAKE SNP and TDX signers for the verifier tests: no SNP or TDX hardware exists here, so a
 * report or quote bound to a test's own runtime data can only be signed by stand-in keys. The
 * certificates are made by the real openssl CLI in a temporary directory, shaped like AMD's (ARK
 * and ASK: RSA-PSS SHA-384 CAs; VCEK: P-384 with AMD's TCB and hwID extensions) and Intel's (root,
 * PCK CA, PCK: P-256), and the structures are laid out as the PSP and the QE lay them out; the
 * genuine vectors in test/fixtures/attest are what shows that the layout and checks match the
 * hardware's.
 */
import { execFileSync } from 'node:child_process';
import { createHash, createPrivateKey, generateKeyPairSync, type KeyObject, sign } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

function openssl(cwd: string, args: string[]): void {
  execFileSync('openssl', args, { cwd, stdio: ['ignore', 'ignore', 'pipe'] });
}

function withDir<T>(fn: (dir: string) => T): T {
  const dir = mkdtempSync(join(tmpdir(), 'kata-ts-fake-signers-'));
  try {
    return fn(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const PSS = ['-sigopt', 'rsa_padding_mode:pss', '-sigopt', 'rsa_pss_saltlen:48', '-sha384'];

/** A TCB as the fake VCEK certifies it. */
export interface FakeTcb {
  bootloader: number;
  tee: number;
  snp: number;
  microcode: number;
}

export interface FakeAmdChain {
  /** ARK and ASK, as a trust bundle. */
  amdCertsPem: string;
  arkDer: Buffer;
  askDer: Buffer;
  vcekDer: Buffer;
  vcekKey: KeyObject;
}

/** A FAKE ARK -> ASK -> VCEK chain (openssl CLI), the VCEK certifying `tcb` and `hwid`. */
export function fakeAmdChain(tcb: FakeTcb, hwid: Buffer, name = 'Fake'): FakeAmdChain {
  return withDir((dir) => {
    const ca = 'basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n';
    writeFileSync(join(dir, 'ca.ext'), ca);
    openssl(dir, [
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-keyout',
      'ark.key',
      '-out',
      'ark.pem',
      '-subj',
      `/CN=ARK-${name}`,
      '-days',
      '30',
      ...PSS,
      '-addext',
      'basicConstraints=critical,CA:TRUE',
    ]);
    openssl(dir, ['req', '-new', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ask.key', '-out', 'ask.csr', '-subj', `/CN=SEV-${name}`]);
    openssl(dir, [
      'x509',
      '-req',
      '-in',
      'ask.csr',
      '-CA',
      'ark.pem',
      '-CAkey',
      'ark.key',
      '-CAcreateserial',
      '-out',
      'ask.pem',
      '-days',
      '30',
      ...PSS,
      '-extfile',
      'ca.ext',
    ]);
    openssl(dir, ['ecparam', '-name', 'secp384r1', '-genkey', '-noout', '-out', 'vcek.key']);
    openssl(dir, ['req', '-new', '-key', 'vcek.key', '-out', 'vcek.csr', '-subj', '/CN=SEV-VCEK']);
    const oid = (n: string) => `1.3.6.1.4.1.3704.1.${n}`;
    writeFileSync(
      join(dir, 'vcek.ext'),
      [
        `${oid('3.1')}=ASN1:INTEGER:${tcb.bootloader}`,
        `${oid('3.2')}=ASN1:INTEGER:${tcb.tee}`,
        `${oid('3.3')}=ASN1:INTEGER:${tcb.snp}`,
        `${oid('3.8')}=ASN1:INTEGER:${tcb.microcode}`,
        `${oid('4')}=ASN1:FORMAT:HEX,OCTETSTRING:${hwid.toString('hex')}`,
        '',
      ].join('\n'),
    );
    openssl(dir, [
      'x509',
      '-req',
      '-in',
      'vcek.csr',
      '-CA',
      'ask.pem',
      '-CAkey',
      'ask.key',
      '-CAcreateserial',
      '-out',
      'vcek.der',
      '-outform',
      'DER',
      '-days',
      '30',
      ...PSS,
      '-extfile',
      'vcek.ext',
    ]);
    const pem = (f: string) => readFileSync(join(dir, f), 'utf8');
    const der = (f: string) => Buffer.from(pem(f).replace(/-----[^-]+-----|\s/g, ''), 'base64');
    return {
      amdCertsPem: pem('ask.pem') + pem('ark.pem'),
      arkDer: der('ark.pem'),
      askDer: der('ask.pem'),
      vcekDer: readFileSync(join(dir, 'vcek.der')),
      vcekKey: createPrivateKey(pem('vcek.key')),
    };
  });
}

/** Fields of a FAKE SNP report; the rest are zero. */
export interface FakeSnpReportFields {
  version?: number;
  policy?: bigint;
  vmpl?: number;
  reportData: Buffer;
  measurement: Buffer;
  hostData?: Buffer;
  chipId: Buffer;
  tcb: FakeTcb;
  /** Version 5: LAUNCH_MIT_VECTOR and CURRENT_MIT_VECTOR. */
  mitVectors?: [bigint, bigint];
}

/** A v3 (or `version`) Milan report laid out as the PSP does, signed by the FAKE VCEK key (R and S little-endian, 72 bytes each). */
export function fakeSnpReport(f: FakeSnpReportFields, key: KeyObject): Buffer {
  const r = Buffer.alloc(0x4a0);
  r.writeUInt32LE(f.version ?? 3, 0x00);
  r.writeBigUInt64LE(f.policy ?? 0x30000n, 0x08);
  r.writeUInt32LE(f.vmpl ?? 0, 0x30);
  r.writeUInt32LE(1, 0x34);
  const tcb = Buffer.from([f.tcb.bootloader, f.tcb.tee, 0, 0, 0, 0, f.tcb.snp, f.tcb.microcode]);
  for (const at of [0x38, 0x180, 0x1e0, 0x1f0]) tcb.copy(r, at);
  f.reportData.copy(r, 0x50);
  f.measurement.copy(r, 0x90);
  (f.hostData ?? Buffer.alloc(32)).copy(r, 0xc0);
  r.writeUInt8(0x19, 0x188);
  r.writeUInt8(0x01, 0x189);
  f.chipId.copy(r, 0x1a0);
  if (f.mitVectors !== undefined) {
    r.writeBigUInt64LE(f.mitVectors[0], 0x1f8);
    r.writeBigUInt64LE(f.mitVectors[1], 0x200);
  }
  const sig = sign('sha384', r.subarray(0, 0x2a0), { key, dsaEncoding: 'ieee-p1363' });
  Buffer.from(sig.subarray(0, 48)).reverse().copy(r, 0x2a0);
  Buffer.from(sig.subarray(48, 96)).reverse().copy(r, 0x2e8);
  return r;
}

export interface FakeIntelChain {
  rootPem: string;
  /** PCK, PCK CA, root: the quote's certification data. */
  chainPem: string;
  pckKey: KeyObject;
}

/** The FMSPC the FAKE PCK certificate names. */
export const FAKE_FMSPC = '00906ed50000';

/** A FAKE Intel root -> PCK CA -> PCK chain (openssl CLI, P-256), the PCK with an SGX extension. */
export function fakeIntelChain(): FakeIntelChain {
  return withDir((dir) => {
    writeFileSync(join(dir, 'ca.ext'), 'basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n');
    for (const k of ['root', 'pckca', 'pck']) openssl(dir, ['ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', `${k}.key`]);
    openssl(dir, [
      'req',
      '-x509',
      '-key',
      'root.key',
      '-out',
      'root.pem',
      '-subj',
      '/CN=Fake SGX Root CA',
      '-days',
      '30',
      '-sha256',
      '-addext',
      'basicConstraints=critical,CA:TRUE',
    ]);
    openssl(dir, ['req', '-new', '-key', 'pckca.key', '-out', 'pckca.csr', '-subj', '/CN=Fake SGX PCK Platform CA']);
    openssl(dir, [
      'x509',
      '-req',
      '-in',
      'pckca.csr',
      '-CA',
      'root.pem',
      '-CAkey',
      'root.key',
      '-CAcreateserial',
      '-out',
      'pckca.pem',
      '-days',
      '30',
      '-sha256',
      '-extfile',
      'ca.ext',
    ]);
    openssl(dir, ['req', '-new', '-key', 'pck.key', '-out', 'pck.csr', '-subj', '/CN=Fake SGX PCK Certificate']);
    // Intel's SGX extension with the two members the verifier reads (PCE id, FMSPC).
    writeFileSync(
      join(dir, 'pck.ext'),
      [
        '[pck]',
        '1.2.840.113741.1.13.1=ASN1:SEQUENCE:sgx',
        '[sgx]',
        'pceid=SEQUENCE:pceid',
        'fmspc=SEQUENCE:fmspc',
        '[pceid]',
        'oid=OID:1.2.840.113741.1.13.1.3',
        'val=FORMAT:HEX,OCTETSTRING:0000',
        '[fmspc]',
        'oid=OID:1.2.840.113741.1.13.1.4',
        `val=FORMAT:HEX,OCTETSTRING:${FAKE_FMSPC}`,
        '',
      ].join('\n'),
    );
    openssl(dir, [
      'x509',
      '-req',
      '-in',
      'pck.csr',
      '-CA',
      'pckca.pem',
      '-CAkey',
      'pckca.key',
      '-CAcreateserial',
      '-out',
      'pck.pem',
      '-days',
      '30',
      '-sha256',
      '-extfile',
      'pck.ext',
      '-extensions',
      'pck',
    ]);
    const pem = (f: string) => readFileSync(join(dir, f), 'utf8');
    return {
      rootPem: pem('root.pem'),
      chainPem: pem('pck.pem') + pem('pckca.pem') + pem('root.pem'),
      pckKey: createPrivateKey(pem('pck.key')),
    };
  });
}

/** Fields of a FAKE TD report body; the rest are zero. */
export interface FakeTdFields {
  mrTd: Buffer;
  rtmr: Buffer[];
  mrConfigId?: Buffer;
  reportData: Buffer;
  tdAttributes?: bigint;
}

const INTEL_QE_VENDOR = Buffer.from('939a7233f79c4ca9940a0db3957f0607', 'hex');

/** A v4 quote laid out as the QE does, signed by a FAKE attestation key that a FAKE QE report (signed by the FAKE PCK) binds. */
export function fakeTdxQuote(f: FakeTdFields, chain: FakeIntelChain): Buffer {
  const header = Buffer.alloc(48);
  header.writeUInt16LE(4, 0);
  header.writeUInt16LE(2, 2);
  header.writeUInt32LE(0x81, 4);
  INTEL_QE_VENDOR.copy(header, 12);
  const body = Buffer.alloc(584);
  body.writeBigUInt64LE(f.tdAttributes ?? 0n, 120);
  f.mrTd.copy(body, 136);
  (f.mrConfigId ?? Buffer.alloc(48)).copy(body, 184);
  f.rtmr.forEach((m, i) => {
    m.copy(body, 328 + 48 * i);
  });
  f.reportData.copy(body, 520);
  const attKey = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const jwk = attKey.publicKey.export({ format: 'jwk' });
  const attPub = Buffer.concat([Buffer.from(jwk.x as string, 'base64url'), Buffer.from(jwk.y as string, 'base64url')]);
  const signed = Buffer.concat([header, body]);
  const quoteSig = sign('sha256', signed, { key: attKey.privateKey, dsaEncoding: 'ieee-p1363' });
  const auth = Buffer.alloc(32, 0x5a);
  const qeReport = Buffer.alloc(384);
  createHash('sha256').update(attPub).update(auth).digest().copy(qeReport, 320);
  const qeSig = sign('sha256', qeReport, { key: chain.pckKey, dsaEncoding: 'ieee-p1363' });
  const pem = Buffer.from(chain.chainPem, 'latin1');
  const u16 = (n: number) => Buffer.from([n & 0xff, n >> 8]);
  const u32 = (n: number) => {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(n);
    return b;
  };
  const qeCert = Buffer.concat([qeReport, qeSig, u16(auth.length), auth, u16(5), u32(pem.length), pem]);
  const sigData = Buffer.concat([quoteSig, attPub, u16(6), u32(qeCert.length), qeCert]);
  return Buffer.concat([signed, u32(sigData.length), sigData]);
}
