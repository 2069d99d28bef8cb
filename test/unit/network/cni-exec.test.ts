/**
 * The CNI execution protocol against fake plugins (shell scripts that log what they were given):
 * ADD in order with each plugin handed the previous result, DEL in reverse with every plugin asked
 * even after a failure, CNI_* variables, runtimeConfig only for declared capabilities, and a
 * plugin's error object turned into the error's message.
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { parseCniConfig } from '../../../src/network/cni-config.js';
import { type CniAttachment, cniAdd, cniDel } from '../../../src/network/cni-exec.js';
import { rejection } from '../../helpers/kata-error.js';

let dir: string;
const att: CniAttachment = {
  containerId: 'c'.repeat(64),
  netnsPath: '/run/netns/kata-ts-cccccccccccccccc',
  ifName: 'eth0',
  args: 'IgnoreUnknown=1;K8S_POD_NAME=p',
  runtimeConfig: { portMappings: [{ hostPort: 80, containerPort: 8080, protocol: 'tcp' }] },
};

/** A plugin that appends "<name> <command> <stdin>" to calls.log and prints `result` (or fails). */
async function plugin(name: string, result: object | 'fail'): Promise<string> {
  const file = path.join(dir, name);
  const out =
    result === 'fail' ? `echo '{"code":7,"msg":"${name} says no","details":"really"}'; exit 1` : `echo '${JSON.stringify(result)}'`;
  await writeFile(
    file,
    `#!/bin/sh\nin=$(cat)\necho "${name} $CNI_COMMAND $CNI_CONTAINERID $CNI_NETNS $CNI_IFNAME $CNI_PATH $in" >> ${dir}/calls.log\n${out}\n`,
    { mode: 0o755 },
  );
  return file;
}

async function calls(): Promise<Array<{ name: string; command: string; env: string[]; stdin: Record<string, unknown> }>> {
  const text = await readFile(path.join(dir, 'calls.log'), 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const [name, command, ...rest] = l.split(' ');
      const json = rest.slice(4).join(' ');
      return { name: name!, command: command!, env: rest.slice(0, 4), stdin: JSON.parse(json) as Record<string, unknown> };
    });
}

const list = parseCniConfig(
  JSON.stringify({
    cniVersion: '1.0.0',
    name: 'n',
    plugins: [
      { type: 'first', x: 1 },
      { type: 'second', capabilities: { portMappings: true } },
    ],
  }),
  '/x/10.conflist',
);
const opts = () => ({ pluginPaths: [path.join(dir, 'first'), path.join(dir, 'second')], binDirs: [dir], timeoutMs: 5000 });

beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'kts-cniexec-'));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('cniAdd / cniDel', () => {
  it('ADD runs the list in order, chaining prevResult; the last result is returned', async () => {
    await plugin('first', { cniVersion: '1.0.0', ips: [{ address: '10.0.0.5/24' }] });
    await plugin('second', { cniVersion: '1.0.0', ips: [{ address: '10.0.0.5/24' }], from: 'second' });
    const result = await cniAdd(list, att, opts());
    expect(result).toMatchObject({ from: 'second' });
    const log = await calls();
    expect(log.map((c) => [c.name, c.command])).toEqual([
      ['first', 'ADD'],
      ['second', 'ADD'],
    ]);
    expect(log[0]!.env).toEqual([att.containerId, att.netnsPath, 'eth0', dir]);
    expect(log[0]!.stdin).toEqual({ type: 'first', x: 1, cniVersion: '1.0.0', name: 'n' });
    expect(log[1]!.stdin).toMatchObject({ runtimeConfig: att.runtimeConfig, prevResult: { ips: [{ address: '10.0.0.5/24' }] } });
  });

  it('DEL runs in reverse, asks every plugin even after a failure, and throws the first failure with its message', async () => {
    await plugin('first', {});
    await plugin('second', 'fail');
    const err = await rejection(cniDel(list, att, opts(), { ips: [] }));
    expect(err.reason).toBe('CNI_PLUGIN_FAILED');
    expect(err.message).toContain('second says no: really');
    expect((await calls()).map((c) => [c.name, c.command])).toEqual([
      ['second', 'DEL'],
      ['first', 'DEL'],
    ]);
  });

  it('a plugin that cannot run is CNI_PLUGIN_FAILED naming it', async () => {
    const err = await rejection(cniAdd(list, att, { ...opts(), pluginPaths: [path.join(dir, 'missing'), path.join(dir, 'missing')] }));
    expect(err.reason).toBe('CNI_PLUGIN_FAILED');
    expect(err.message).toContain('plugin first');
  });
});
