import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { packageRoot } from '../../src/common/paths.js';

/**
 * The guest with the real agent, in the test cache (KATA_TS_AGENT_GUEST_DIR, else
 * .cache/guest-agent), built by scripts/build-guest.sh when missing or out of date; never the
 * installed one.
 */
export function ensureAgentGuest(): { kernelPath: string; initrdPath: string; guestImagePath: string } {
  const repo = packageRoot();
  const dir = agentGuestDir();
  execFileSync('bash', [path.join(repo, 'scripts/build-guest.sh'), '--out', dir], { stdio: ['ignore', 'ignore', 'inherit'] });
  return {
    kernelPath: path.join(dir, 'vmlinuz'),
    initrdPath: path.join(dir, 'initramfs.cpio.gz'),
    guestImagePath: path.join(dir, 'guest.img'),
  };
}

/**
 * Where ensureAgentGuest builds: one directory for every test that boots this tree's agent with
 * build-guest.sh's defaults, so the suite builds that guest (and boots it once for the agent's
 * start-up snapshot) once, not once per test file.
 */
export function agentGuestDir(): string {
  return process.env.KATA_TS_AGENT_GUEST_DIR ?? path.join(packageRoot(), '.cache/guest-agent');
}

/** What the real agent's 'agent serving' line says about its start (guest/agent/main.ts). */
export interface AgentServingEntry {
  launchedAtS: number;
  startedAtS?: number;
  readyAtS: number;
  /** init's count of agent starts in this boot: 2 after a refused snapshot. */
  start?: number;
  codeSource?: 'snapshot' | 'bundle';
}

/** The first 'agent serving' line (pino JSON after the console's prefix) in a guest's console text. */
export function agentServingEntry(consoleText: string): AgentServingEntry | undefined {
  for (const line of consoleText.split('\n')) {
    const start = line.indexOf('{');
    if (start < 0 || !line.includes('"agent serving"')) continue;
    const entry: unknown = JSON.parse(line.slice(start));
    if (typeof entry !== 'object' || entry === null) throw new Error(`the agent's serving line is not an object: ${line}`);
    const e = entry as Record<string, unknown>;
    if (typeof e.launchedAtS !== 'number' || typeof e.readyAtS !== 'number')
      throw new Error(`the agent's serving line has no launchedAtS/readyAtS (an agent from before they were logged?): ${line}`);
    return {
      launchedAtS: e.launchedAtS,
      readyAtS: e.readyAtS,
      ...(typeof e.startedAtS === 'number' ? { startedAtS: e.startedAtS } : {}),
      ...(typeof e.start === 'number' ? { start: e.start } : {}),
      ...(e.codeSource === 'snapshot' || e.codeSource === 'bundle' ? { codeSource: e.codeSource } : {}),
    };
  }
  return undefined;
}
