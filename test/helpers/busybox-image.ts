import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { buildImage, busyboxBaseEntries, RegistryPusher } from './images-builder.js';
import type { RegistryHandle } from './images-registry.js';
import type { TarEntrySpec } from './images-tar.js';

/**
 * A one-layer busybox image (the host's /bin/busybox, `/bin/sh` as its command) with a symlink per
 * applet, pushed to a loopback registry as `<repo>:<tag>`; answers the reference to pull.
 */
export async function pushBusyboxImage(registry: RegistryHandle, repo: string, tag: string, applets: readonly string[]): Promise<string> {
  const entries: TarEntrySpec[] = [
    ...busyboxBaseEntries(),
    ...applets.map((a): TarEntrySpec => ({ name: `bin/${a}`, type: 'symlink', linkname: 'busybox' })),
  ];
  const built = await buildImage({ layers: [{ entries, compression: 'gzip' }], cmd: ['/bin/sh'] });
  await new RegistryPusher(registry.url).pushImage(repo, tag, built);
  return `${registry.host}/${repo}:${tag}`;
}

/**
 * Points a test daemon's config (before its start) at a registries file of its own that allows
 * plain HTTP to loopback registries, as the tests' registries serve.
 */
export async function allowLoopbackRegistries(rt: { dir: string; configPath: string }): Promise<void> {
  const registries = path.join(rt.dir, 'registries.json');
  await fsp.writeFile(registries, JSON.stringify({ registries: { '127.0.0.1:*': { plainHttp: true } } }));
  const cfg = JSON.parse(await fsp.readFile(rt.configPath, 'utf8')) as { images?: Record<string, unknown> };
  cfg.images = { ...(cfg.images ?? {}), registriesConfigPath: registries };
  await fsp.writeFile(rt.configPath, JSON.stringify(cfg));
}
