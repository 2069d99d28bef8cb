/**
 * The attestation token the broker answers a granted Attestation with (trustee's
 * AttestationToken): a JWT, ES256, signed with the state directory's token key. Claims: `iss`,
 * `iat`, `exp` (the session's expiry), `jwk` (the broker's public key, as trustee's token carries
 * its own), `tee`, `tee-pubkey` (the key resources are encrypted to), `matched` (the reference
 * sets the evidence matched) and `claims_digest` (sha256 of the verified claims, sorted JSON),
 * so a relying party can tell which measurements were judged without the token carrying them all.
 */
import { createHash, createPrivateKey, createPublicKey, type KeyObject } from 'node:crypto';
import { jwtVerify, SignJWT } from 'jose';
import type { TeePubkey } from '../attest/kbs-protocol.js';
import type { AttestClaims, VerifiedTee } from '../attest/verifier.js';
import { invalid } from '../common/errors.js';
import './reasons.js';

export const TOKEN_ISSUER = 'kata-ts-broker';
export const TOKEN_ALG = 'ES256';

export interface TokenClaims {
  tee: VerifiedTee;
  matched: string[];
  claims_digest: string;
  'tee-pubkey': TeePubkey;
}

/** Pure: sha256 (hex) of the claims as JSON with sorted keys: stable whatever order a verifier built them in. */
export function claimsDigest(claims: AttestClaims): string {
  const sorted = (o: Record<string, string>) => Object.fromEntries(Object.entries(o).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
  const canonical = JSON.stringify({ tee: claims.tee, measurements: sorted(claims.measurements) });
  return createHash('sha256').update(canonical).digest('hex');
}

export class TokenSigner {
  private readonly publicJwk: Record<string, unknown>;

  private constructor(private readonly key: KeyObject) {
    const jwk = createPublicKey(key).export({ format: 'jwk' }) as Record<string, unknown>;
    this.publicJwk = { kty: jwk.kty, crv: jwk.crv, x: jwk.x, y: jwk.y };
  }

  /** From the PEM of token-key.pem; throws BROKER_STATE_INVALID when it is not an EC P-256 private key. */
  static fromPem(pem: string): TokenSigner {
    let key: KeyObject;
    try {
      key = createPrivateKey(pem);
    } catch (err) {
      throw invalid('BROKER_STATE_INVALID', 'token-key.pem is not a private key', { cause: err });
    }
    if (key.asymmetricKeyType !== 'ec' || key.asymmetricKeyDetails?.namedCurve !== 'prime256v1')
      throw invalid('BROKER_STATE_INVALID', 'token-key.pem must be an EC P-256 key');
    return new TokenSigner(key);
  }

  /** The broker's public key (JWK), for relying parties. */
  get jwk(): Record<string, unknown> {
    return { ...this.publicJwk };
  }

  async sign(claims: TokenClaims, nowMs: number, expiresAtMs: number): Promise<string> {
    return new SignJWT({ ...claims, jwk: this.publicJwk })
      .setProtectedHeader({ alg: TOKEN_ALG, typ: 'JWT' })
      .setIssuer(TOKEN_ISSUER)
      .setIssuedAt(Math.floor(nowMs / 1000))
      .setExpirationTime(Math.floor(expiresAtMs / 1000))
      .sign(this.key);
  }

  /** Verifies a token this signer made (tests, relying parties in-process). */
  async verify(token: string, nowMs: number): Promise<TokenClaims & { iat: number; exp: number }> {
    const { payload } = await jwtVerify(token, createPublicKey(this.key), {
      issuer: TOKEN_ISSUER,
      algorithms: [TOKEN_ALG],
      currentDate: new Date(nowMs),
    });
    return payload as unknown as TokenClaims & { iat: number; exp: number };
  }
}
