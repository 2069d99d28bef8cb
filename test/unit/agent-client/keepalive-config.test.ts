import { describe, expect, it } from 'vitest';
import { AGENT_KEEPALIVE_DEFAULTS } from '../../../src/agent-client/index.js';
import { KataError } from '../../../src/common/errors.js';
import { defaultConfig } from '../../../src/config/defaults.js';
import { parseConfigDocument } from '../../../src/config/load.js';

/** The problems a refused config document lists (CONFIG_INVALID). */
function problemsOf(doc: unknown): string[] {
  try {
    parseConfigDocument(doc, 'test');
  } catch (err) {
    expect(err).toBeInstanceOf(KataError);
    expect((err as KataError).reason).toBe('CONFIG_INVALID');
    return ((err as KataError).details?.problems as string[]) ?? [];
  }
  throw new Error('expected the config to be refused');
}

describe('hypervisor.agentKeepalive', () => {
  it("defaults to the connection's own keepalive (a PING every 10 s, one miss ends the session)", () => {
    expect(defaultConfig().hypervisor.agentKeepalive).toEqual({ intervalMs: 10_000, misses: 3 });
    expect(defaultConfig().hypervisor.agentKeepalive).toEqual(AGENT_KEEPALIVE_DEFAULTS);
  });

  it('a loaded host raises the tolerance; the interval stays the default unless given', () => {
    const config = parseConfigDocument({ hypervisor: { agentKeepalive: { misses: 4 } } }, 'test');
    expect(config.hypervisor.agentKeepalive).toEqual({ intervalMs: 10_000, misses: 4 });
    expect(parseConfigDocument({ hypervisor: { agentKeepalive: { intervalMs: 0 } } }, 'test').hypervisor.agentKeepalive.intervalMs).toBe(0);
  });

  it('refuses a tolerance below one, a negative or fractional interval and unknown keys, naming each', () => {
    for (const [bad, pointer] of [
      [{ misses: 0 }, '/hypervisor/agentKeepalive/misses '],
      [{ misses: 101 }, '/hypervisor/agentKeepalive/misses '],
      [{ intervalMs: -1 }, '/hypervisor/agentKeepalive/intervalMs '],
      [{ intervalMs: 1.5 }, '/hypervisor/agentKeepalive/intervalMs '],
      [{ interval: 5 }, '/hypervisor/agentKeepalive/interval is not a known key'],
    ] as const) {
      const problems = problemsOf({ hypervisor: { agentKeepalive: bad } });
      expect(problems.some((p) => p.startsWith(pointer))).toBe(true);
    }
  });
});
