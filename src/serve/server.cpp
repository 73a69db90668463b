#include "serve/server.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "core/huge_pages.h"
#include "text/chat_template.h"
#include "text/vocab.h"

namespace essaim::serve {

Result<std::unique_ptr<Server>> Server::start(ServerOptions options) {
  std::unique_ptr<Server> s(new Server(std::move(options)));
  Server* raw = s.get();
  ServeApiOptions api{.api_key = s->options_.limits.api_key,
                      .http_stats = [raw] { return raw->http_ ? raw->http_->stats() : net::HttpServerStats{}; },
                      .access_log = {}};
  if (s->options_.access_log)
    api.access_log = [](const std::string& line) { std::fprintf(stderr, "essaim serve: %s\n", line.c_str()); };
  s->api_ = std::make_unique<ServeApi>(std::move(api));
  ESSAIM_ASSIGN_OR_RETURN(s->http_, net::HttpServer::listen(s->options_.host, s->options_.port, s->options_.limits,
                                                       [raw](const net::HttpRequestView& req, std::shared_ptr<net::HttpResponder> out) {
                                                         raw->api_->handle(req, std::move(out));
                                                       },
                                                       s->options_.io_threads,
                                                       [raw](const net::HttpRequestHead& head, auto done) {
                                                         raw->api_->authorize(head, done);
                                                       }));
  s->loader_ = std::thread([raw] {
    Status st = raw->load();
    if (!st) raw->api_->set_failed(st.message());
    std::lock_guard<std::mutex> lock(raw->mu_);
    raw->loaded_ = true;
    raw->load_status_ = std::move(st);
    raw->cv_.notify_all();
  });
  return s;
}

Status Server::load() {
  ESSAIM_ASSIGN_OR_RETURN(model_, load_model(options_.model_path, {.no_mmap = options_.no_mmap, .backbone_file = options_.backbone_file}));
  if (!options_.no_mmap && !options_.keep_page_cache) {
    const std::string note = map_in_huge_pages(model_->file().mapping()).describe(options_.model_path);
    if (!note.empty()) std::fprintf(stderr, "essaim serve: %s\n", note.c_str());
  }
  ESSAIM_ASSIGN_OR_RETURN(Vocab vocab, vocab_from_gguf(model_->file()));
  std::string chat_template = vocab.chat_template;
  if (!options_.chat_template_file.empty()) {
    std::ifstream f(options_.chat_template_file, std::ios::binary);
    if (!f) return Status::error("cannot read --chat-template-file " + options_.chat_template_file);
    chat_template.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    if (chat_template.empty()) return Status::error("--chat-template-file " + options_.chat_template_file + " is empty");
  }
  ESSAIM_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::create(std::move(vocab)));
  tokenizer_.emplace(std::move(tok));
  ESSAIM_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::create(chat_template, *tokenizer_));
  chat_template_.emplace(std::move(tmpl));
  if (chat_template_->is_chatml_fallback())
    std::fprintf(stderr, "essaim serve: %s has no chat template; using ChatML\n", options_.model_path.c_str());
  pool_ = std::make_unique<ThreadPool>(size_t(options_.threads > 0 ? options_.threads : 0));
  if (options_.executor.make) {
    ESSAIM_ASSIGN_OR_RETURN(executor_, options_.executor.make(*model_, pool_.get()));
  } else {
    executor_ = std::make_unique<LocalExpertExecutor>(model_->expert_store(), pool_.get());
  }
  if (options_.spec.draft_max > 0 && options_.drafts_on_backbone && options_.executor.make &&
      !model_->expert_store().shape_only())  // drafts cost no round trip (docs/speculative.md)
    draft_executor_ = std::make_unique<LocalExpertExecutor>(model_->expert_store(), pool_.get());
  scheduler_ = std::make_unique<Scheduler>(*model_, executor_.get(), pool_.get(),
                                           SchedulerOptions{.parallel = options_.parallel,
                                                            .batch_tokens = options_.batch_tokens,
                                                            .queue_capacity = options_.queue_capacity,
                                                            .cache = {.kv_type = KvType::F16, .n_ctx = options_.n_ctx},
                                                            .spec = options_.spec,
                                                            .draft_experts = draft_executor_.get(),
                                                            .prompt_cache = options_.prompt_cache});
  std::string id = options_.model_id;
  if (id.empty()) {
    id = options_.model_path.substr(options_.model_path.find_last_of('/') + 1);
  }
  ServeModel m{.model = model_.get(), .tokenizer = &*tokenizer_, .chat_template = &*chat_template_,
               .reasoning_budget = options_.reasoning_budget, .scheduler = scheduler_.get(),
               .id = id,
               .created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count(),
               .dispatch_stats = {}};
  if (options_.executor.stats) {
    m.dispatch_stats = [this] { return options_.executor.stats(*executor_); };
  }
  if (options_.executor.unavailable) {
    m.unavailable = [this] { return options_.executor.unavailable(*model_, *executor_); };
  }
  api_->set_ready(std::move(m));
  return Status::ok();
}

Status Server::wait_ready(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return loaded_; }))
    return Status::error("the model is still loading after " + std::to_string(timeout.count()) + " ms");
  return load_status_;
}

std::optional<Status> Server::load_result() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!loaded_) return std::nullopt;
  return load_status_;
}

void Server::stop() {
  if (stopped_) return;
  stopped_ = true;
  if (loader_.joinable()) loader_.join();  // loading is bounded (mmap + connects with deadlines)
  if (!http_) return;     // start() failed before listening: nothing else was started
  api_->begin_shutdown();  // new generations: 503
  if (scheduler_) {
    scheduler_->stop();    // every sequence's final event: streams write their error event
    api_->wait_settled(options_.drain);
  }
  http_->stop();          // no new requests, no I/O threads
  scheduler_.reset();
  executor_.reset();
  pool_.reset();
}

Server::~Server() { stop(); }

}  // namespace essaim::serve
